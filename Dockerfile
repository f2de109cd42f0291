# One image for every service of docker-compose.yml: the server, the Ray head (with `hpo worker`)
# and the GPU Ray nodes. The base image brings CUDA and a CUDA build of torch 2.6; the package's own
# range (torch>=2.6 in pyproject.toml) is then already satisfied, so pip keeps it instead of
# downloading another torch. Keep the two in step (tests/test_packaging.py checks it).
FROM pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /opt/hpo
COPY pyproject.toml README.md ./
COPY hpo/ hpo/
COPY server/ server/
COPY worker/ worker/
COPY trainer/ trainer/
COPY migrations/ migrations/
COPY examples/ examples/
# Editable, as the README installs it: `hpo demo` finds examples/ next to the package.
RUN pip install -e .
# Ray's sockets and logs go below this root-only folder (ray start --temp-dir in docker-compose.yml),
# which the trials' uids (--run-as) cannot enter; the installed Python stays readable by them.
RUN mkdir -m 0700 -p /var/lib/hpo-ray && chmod -R a+rX /opt/hpo

EXPOSE 8000
CMD ["hpo", "--help"]
