"""Text extracted from an uploaded file, once, at upload (pure: bytes in, text out).

Three kinds are accepted: plain text, CSV and PDF (text layer only, by `pypdf`; a scanned
page without one yields no text, and the file says so by its page count). The kind is
decided from the declared content type and the name's suffix; the bytes must agree (a PDF
starts with `%PDF-`, text decodes as UTF-8), or the upload is refused.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Any

TEXT = "text/plain"
CSV = "text/csv"
PDF = "application/pdf"
_BY_SUFFIX = {".txt": TEXT, ".md": TEXT, ".text": TEXT, ".csv": CSV, ".pdf": PDF}
_BY_TYPE = {TEXT: TEXT, "text/markdown": TEXT, CSV: CSV, "application/csv": CSV, PDF: PDF}


class UnsupportedFile(ValueError):
    """Not text, CSV or PDF, or bytes that do not read as what the file claims to be."""


@dataclass(frozen=True)
class Extracted:
    content_type: str
    text: str
    # {"pages": n} for a PDF, {"rows": n} (data rows, the header not counted) for a CSV.
    meta: dict[str, Any] = field(default_factory=dict)


def kind_of(name: str, declared: str | None) -> str:
    """The accepted kind of an upload, from its declared type, else its name's suffix."""
    base = (declared or "").split(";")[0].strip().lower()
    if base in _BY_TYPE:
        return _BY_TYPE[base]
    suffix = name[name.rfind(".") :].lower() if "." in name else ""
    if suffix in _BY_SUFFIX and base in ("", "application/octet-stream"):
        return _BY_SUFFIX[suffix]
    raise UnsupportedFile(f"only text, CSV and PDF files are accepted, not {base or name!r}")


def extract(name: str, declared: str | None, data: bytes) -> Extracted:
    kind = kind_of(name, declared)
    if kind == PDF:
        return _pdf(data)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UnsupportedFile("a text or CSV file must be UTF-8") from None
    text = text.replace("\x00", "")  # PostgreSQL text holds no NUL
    if kind == CSV:
        rows = sum(1 for row in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in row))
        return Extracted(CSV, text, {"rows": max(0, rows - 1)})
    return Extracted(TEXT, text)


def _pdf(data: bytes) -> Extracted:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    if not data.startswith(b"%PDF-"):
        raise UnsupportedFile("the file is not a PDF")
    try:
        reader = PdfReader(io.BytesIO(data))
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PyPdfError, ValueError, KeyError, TypeError) as exc:
        raise UnsupportedFile(f"the PDF could not be read: {exc}") from None
    text = "\n\n".join(p.strip() for p in pages if p.strip()).replace("\x00", "")
    return Extracted(PDF, text, {"pages": len(pages)})
