#!/usr/bin/env bash
# Build .gpu/site.tar.xz: the Python packages omnigraph needs that the GPU machine lacks (Ray above
# all), trimmed and compressed so that they travel with a device run (at most 64 MiB per run).
#
# Run it here, on a machine that reaches PyPI, from the repository root:   scripts/gpu_setup.sh
# Then carry `.gpu` in the device run and `source scripts/gpu_env.sh` there (it unpacks the bundle).
#
# The GPU machine has Python 3.12, torch, transformers, peft, safetensors, numpy, networkx, rich,
# pyyaml, matplotlib, psutil, msgpack, protobuf, grpcio, aiohttp, click, filelock, requests,
# packaging, attrs (/work/.library/device/KINDS.md); it has no Ray and no pydantic (nor math-verify, which
# bench/levers.py scores with). The versions
# are those of the local .venv (pyproject.toml pins ray==2.60.0), read from it when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=.gpu
WORK=$(mktemp -d /tmp/og-gpu-setup.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# name==version of each package to carry (the .venv's version when installed there)
PKGS="ray:2.60.0 jsonschema:4.26.0 jsonschema-specifications:2025.9.1 referencing:0.37.0 rpds-py:2026.9.1
      pydantic:2.14.4 pydantic-core:2.50.5 annotated-types:0.8.0 typing-inspection:0.4.5
      typing-extensions:4.16.0 math-verify:0.9.0 latex2sympy2_extended:1.11.0 antlr4-python3-runtime:4.13.2
      transformers:5.19.0 tokenizers:0.23.3 huggingface-hub:2.4.0 httpx2:2.17.0 httpcore2:2.17.0 truststore:0.10.5
      h11:0.16.0 anyio:4.16.0 idna:3.21 fsspec:2026.9.0 hf-xet:1.8.0"
SPECS=()
for item in $PKGS; do
    name=${item%%:*}; fallback=${item#*:}
    ver=$("$PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: print('')" "$name" 2>/dev/null || true)
    SPECS+=("$name==${ver:-$fallback}")
done
echo "packages: ${SPECS[*]}"

python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WORK/whl" "${SPECS[@]}"

mkdir -p "$WORK/site"
for w in "$WORK"/whl/*.whl; do
    python3 -m zipfile -e "$w" "$WORK/site"
done
# Parts of Ray omnigraph never imports (ray/widgets and ray/air are imported at start: keep them)
rm -rf "$WORK"/site/ray/{jars,rllib,data,serve,train,tune,llm,dashboard/client/build}
find "$WORK/site" -name __pycache__ -prune -exec rm -rf {} +
# Ray's own executables (raylet, gcs_server) must stay executable after the zip extraction
chmod -R u+x "$WORK"/site/ray/core/src/ray/raylet "$WORK"/site/ray/core/src/ray/gcs 2>/dev/null || true
find "$WORK/site" -name "*.so" -exec chmod 755 {} +
find "$WORK/site/ray/core" -type f -perm -u=r ! -name "*.py" -exec chmod 755 {} +

# The embedded tiny model, built here once (its warm-start takes a while): the GPU machine copies it
# into its $OMNIGRAPH_CACHE instead of building it in every run
"$PY" -c "from nodes import zoo; zoo.tiny(0)" >/dev/null
tiny=$("$PY" -c "from nodes import zoo; print(zoo.tiny(0, log=lambda *a: None))")
rm -rf "$OUT/cache" && mkdir -p "$OUT/cache/models" && cp -r "$tiny" "$OUT/cache/models/"

mkdir -p "$OUT"
grep -qxF "/$OUT/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/$OUT/" >> .git/info/exclude; }
tar -C "$WORK/site" -cf - . | xz -T0 -6 > "$OUT/site.tar.xz.tmp"
mv "$OUT/site.tar.xz.tmp" "$OUT/site.tar.xz"
printf '%s\n' "${SPECS[@]}" > "$OUT/packages.txt"
echo "wrote $OUT/site.tar.xz ($(du -h "$OUT/site.tar.xz" | cut -f1); unpacked $(du -sh "$WORK/site" | cut -f1))"
