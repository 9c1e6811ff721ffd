"""A user's data through its life, after the conversation: what leaves, what expires and
what is erased, each in one module here (its rules, pure, in `parley/` under the same name).

`exports` (a user's archive of their own data: the request, its progress and the reads that
fill it), `retention` (the purge's batches of expired rows), `forget` (one message and every
stored copy of its text), `erasure` (a user or a deleted session erased: the request, its
progress, its receipt) with `erasure_catalogue` (every table that can hold a user's rows,
and the batched delete) and `eval_drafts` (the captured eval drafts, files holding user text,
that an erasure or a forgotten message removes).

Like every store module, nothing here commits: the caller does (see `parley.store`).
"""
