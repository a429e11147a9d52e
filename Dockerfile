# syntax=docker/dockerfile:1
#
# Switchboard server image.
#
#   docker build -t switchboard .
#   docker run --read-only --tmpfs /tmp -p 8000:8000 \
#     -e DATABASE_URL=... -e SWITCHBOARD_JWT_SECRET=... switchboard
#
# Two stages: the builder builds the project's wheel and installs it (with its
# dependencies) into a virtualenv in /opt/venv; the final stage is python-slim
# plus that venv and an unprivileged user. The SQL (migrations, functions, the
# sqitch project, pgTAP tests) is package data inside the wheel
# (site-packages/switchboard/db), so the image runs exactly what `pip install
# switchboard-<version>-py3-none-any.whl` gives a user, not the source tree.
# No compiler, no pip cache, no system libpq: psycopg 3 comes as
# psycopg[binary] and psycopg2 (for pgmigrate) as psycopg2-binary, both with
# libpq bundled. The root filesystem can be mounted read-only; only /tmp must
# be writable.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

RUN python -m venv /opt/venv

WORKDIR /src

# Dependencies first, so a code change does not reinstall them. README.m[d] is
# a glob so the build works before the README exists (pyproject names it).
COPY pyproject.toml README.m[d] ./

# yandex-pgmigrate requires "psycopg2", which has no Linux wheels: pip would
# compile it against libpq-dev. Installing psycopg2-binary beside it does not
# satisfy that requirement (a different distribution name), so pgmigrate is
# installed with --no-deps after its real dependencies (psycopg2-binary
# provides the same `psycopg2` module), and the project's other dependencies
# are read from pyproject.toml and installed normally.
RUN pip install "psycopg2-binary>=2.9.11" "PyYAML>=6.0.3" "sqlparse>=0.4" \
 && python -c 'import tomllib; deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]; print("\n".join(d for d in deps if d.startswith("yandex-pgmigrate")))' > /tmp/pgmigrate.txt \
 && python -c 'import tomllib; deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]; print("\n".join(d for d in deps if not d.startswith("yandex-pgmigrate")))' > /tmp/requirements.txt \
 && pip install --no-deps -r /tmp/pgmigrate.txt \
 && pip install -r /tmp/requirements.txt

# server/switchboard/db is a link to db/: the build copies the SQL files into
# the wheel through it.
COPY server/ server/
COPY db/ db/

# The project as a wheel, installed without re-resolving dependencies (that
# would pull the psycopg2 source distribution back in). Bytecode is compiled
# here because the final image's site-packages are read-only.
RUN pip wheel --no-deps -w /tmp/dist . \
 && pip install --no-deps /tmp/dist/switchboard-*.whl \
 && rm -rf /tmp/dist build \
 && python -m compileall -q /opt/venv/lib \
 && python -c 'import psycopg, psycopg2, pgmigrate, switchboard.cli' \
 && cd / && switchboard --version \
 && python -c 'from switchboard.migrate import db_dir; d = db_dir(); assert str(d).startswith("/opt/venv/"), d'

# ---------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}

# A fixed numeric user (the chart's runAsUser). It has a passwd entry because
# libpq looks up the OS user name when a URL names no database user.
RUN groupadd --system --gid 10001 switchboard \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin switchboard

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp

COPY --from=builder /opt/venv /opt/venv

WORKDIR /app
USER 10001:10001
EXPOSE 8000

# SIGTERM (the default stop signal) starts the drain: readiness fails, work is
# handed back and WebSockets are closed with 1012.
ENTRYPOINT ["switchboard"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
