// Model text as safe Markdown: markdown-it with raw HTML off (so `<img onerror>` is shown as
// text), then DOMPurify over the result before it enters the page. Rendering the whole text
// again on every streamed frame keeps half-written Markdown (an unclosed code fence) harmless.

import markdownit from '../vendor/markdown-it/markdown-it.esm.min.mjs';
import DOMPurify from '../vendor/dompurify/purify.es.mjs';

const md = markdownit({ html: false, linkify: true, breaks: true });
// A masked address (p***@example.com) is not a link.
md.linkify.set({ fuzzyEmail: false });

const PURIFY = {
  // No images (tracking pixels) or forms in an answer; links only.
  FORBID_TAGS: ['img', 'style', 'form', 'input', 'button', 'textarea', 'select', 'svg', 'math'],
  FORBID_ATTR: ['style'],
  ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#)/i,
};

DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A' && node.getAttribute('href')) {
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer nofollow');
  }
});

export function renderMarkdown(target, text) {
  const html = DOMPurify.sanitize(md.render(text || ''), PURIFY);
  target.innerHTML = html;
}
