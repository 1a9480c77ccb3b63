#!/usr/bin/env bash
# The published chat templates the parser round trips test (tests/templates/published.toml):
# llama.cpp's models/templates/*.jinja as vendored in the llama-cpp-python sdist on PyPI,
# pinned by version and sha256, extracted into .cache/templates/published (not committed).
# Usage: scripts/published_templates.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.cache/templates/published}"
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SDIST=".cache/templates/llama_cpp_python-$VERSION.tar.gz"
[ -f "$DIR/.llama-cpp-python-$VERSION" ] && exit 0
mkdir -p .cache/templates
if ! echo "$SHA256  $SDIST" | sha256sum -c --quiet 2>/dev/null; then
  python -m pip download -q --no-deps --no-binary :all: -d .cache/templates \
    "llama-cpp-python==$VERSION"
  echo "$SHA256  $SDIST" | sha256sum -c --quiet
fi
rm -rf "$DIR" && mkdir -p "$DIR"
tar -xzf "$SDIST" -C "$DIR" --strip-components=5 --wildcards \
  "llama_cpp_python-$VERSION/vendor/llama.cpp/models/templates/*.jinja"
touch "$DIR/.llama-cpp-python-$VERSION"
echo "published templates: $(ls "$DIR" | wc -l) in $DIR"
