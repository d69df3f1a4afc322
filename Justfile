# vgpuctl tasks. `just --list` shows them.

set shell := ["bash", "-euo", "pipefail", "-c"]

python := env_var_or_default("PYTHON", "python3")

# Build a simulated A2 node (the seed's), check it, plan, apply, show status, re-plan to "No changes."
# Each command is shown as it runs: `sim init`'s export line points the others at the simulated
# host, so they can be pasted into a shell as they are (README.md, "What `just demo` shows").
demo:
    #!/usr/bin/env bash
    set -euo pipefail
    dir=$(mktemp -d -t vgpuctl-demo.XXXXXX)
    trap 'rm -rf "$dir"' EXIT
    say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
    say "eval \"\$(vgpuctl sim init $dir --gpu A2@0000:08:00.0 --node harvester-kgd9c)\""
    eval "$(vgpuctl sim init "$dir" --gpu A2@0000:08:00.0 --node harvester-kgd9c)"
    say vgpuctl doctor
    vgpuctl doctor
    say vgpuctl validate desired-state/harvester-kgd9c.yaml
    vgpuctl validate desired-state/harvester-kgd9c.yaml
    say vgpuctl plan desired-state/harvester-kgd9c.yaml
    vgpuctl plan desired-state/harvester-kgd9c.yaml
    say vgpuctl apply desired-state/harvester-kgd9c.yaml --yes
    vgpuctl apply desired-state/harvester-kgd9c.yaml --yes
    say vgpuctl status
    vgpuctl status
    say "vgpuctl status -o crds | awk '/^---\$/ { n++ } n < 2'   # the SRIOVGPUDevice and the first of 16 VGPUDevices"
    vgpuctl status -o crds | awk '/^---$/ { n++ } n < 2'
    say vgpuctl plan desired-state/harvester-kgd9c.yaml --detailed-exitcode
    vgpuctl plan desired-state/harvester-kgd9c.yaml --detailed-exitcode

# Lint and type-check, then run the whole test suite, and then the real-API tier (`just
# test-real`) when its binaries are built (else a line says how to build them). Temporary trees go to tmpfs when there is
# one: simulated sysfs trees are thousands of small files, and sysfs itself lives in memory.
# Two workers per core (at most 16): most tests wait on subprocesses, a watch agent or the API
# emulator, so one worker per core leaves the cores half idle (on 2 cores: 9 min 15 s with 2
# workers, 4 min 25 s with 4). Work-stealing keeps a long test from ending the run alone.
test: lint
    if [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi; \
    cores=$(nproc 2>/dev/null || echo 2); workers=$(( cores * 2 > 16 ? 16 : cores * 2 )); \
    {{python}} -m pytest -q -n "$workers" --dist worksteal -m "not realapi"
    if {{python}} -c 'import sys; from tests import real_apiserver as r; sys.exit(not r.built())'; \
    then just python={{python}} _test-real; \
    else {{python}} -c 'from tests import real_apiserver as r; print("real-API tier skipped:", r.NOT_BUILT)'; fi

# The first time, tests/realapi/build takes long: README.md, "Against a real API server".
# The real-API tier: the tests marked `realapi` against a real kube-apiserver and etcd
# (tests/real_apiserver.py), built first by tests/realapi/build unless its cache has them.
test-real:
    tests/realapi/build >/dev/null
    just python={{python}} _test-real

# Each worker process starts its own etcd and kube-apiserver (about 0.5 GB together), so at
# most four: on 2 cores, 74 tests took 149 s in one process, 97 s in two, 86 s in four.
_test-real:
    if [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi; \
    cores=$(nproc 2>/dev/null || echo 2); workers=$(( cores * 2 > 4 ? 4 : cores * 2 )); \
    VGPUCTL_REQUIRE_REALAPI=1 {{python}} -m pytest -q -n "$workers" --dist worksteal -m realapi

# ruff, mypy --strict and the import-linter layer contracts.
lint:
    {{python}} -m ruff check reconciler tests
    {{python}} -m ruff format --check reconciler tests
    {{python}} -m mypy --strict reconciler
    lint-imports

# Regenerate the device-plugin gRPC code from reconciler/deviceplugin/v1beta1/api.proto.
proto:
    {{python}} -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. --pyi_out=. reconciler/deviceplugin/v1beta1/api.proto

# Benchmarks (engine, device plugin, watch); each writes its JSON results to a file too.
bench:
    if [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi; \
    {{python}} tests/bench/run.py --out bench-results.json && \
    {{python}} -m tests.bench.deviceplugin --out bench-deviceplugin.json && \
    {{python}} -m tests.bench.watch --out bench-watch.json

# Reliability suite: randomized SIGKILLed applies and watches, 10,000 bad desired-state documents,
# applies racing each other and a watch, faults survived under apply and under watch. Figures as
# JSON in reliability-results.json (and on stdout); about sixteen minutes on two cores.
# `just reliability ci` is the bounded size (also run by `just test`).
reliability size="full":
    if [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi; \
    {{python}} -m tests.reliability.suite --size {{size}} --out reliability-results.json

# Regenerate the image's hashed locks from pyproject.toml (pip-tools' pip-compile: `pip install
# pip-tools`): requirements.lock, vgpuctl's dependencies, and requirements-build.lock, its build
# backend; every file's sha256, for the Containerfile's `pip install --require-hashes`. Pins
# already there are kept; `just lock --upgrade` takes the newest versions pyproject.toml allows.
lock *args:
    export CUSTOM_COMPILE_COMMAND="just lock" PIP_FIND_LINKS=; \
    opts="--quiet --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url --no-emit-find-links"; \
    {{python}} -m piptools compile $opts {{args}} --output-file requirements.lock pyproject.toml && \
    {{python}} -m piptools compile $opts {{args}} --only-build-deps --build-deps-for=wheel \
        --output-file requirements-build.lock pyproject.toml
