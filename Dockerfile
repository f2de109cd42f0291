# One image for every service of docker-compose.yml: the server, the Ray head (with `hpo worker`)
# and the GPU Ray nodes. The base image brings CUDA and a CUDA build of torch; the package's own
# range (torch>=2.2) is then already satisfied, so pip keeps it.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

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

EXPOSE 8000
CMD ["hpo", "--help"]
