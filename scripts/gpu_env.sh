# Source this ON the GPU machine, from the repository root (the device run's working directory):
#     source scripts/gpu_env.sh
# It unpacks .gpu/site.tar.xz (made by scripts/gpu_setup.sh here, carried with `carry: [".gpu"]`)
# into /tmp/og-site once, and puts it and the repository on PYTHONPATH.
if [ ! -f .gpu/site.tar.xz ]; then
    echo "gpu_env: .gpu/site.tar.xz is missing: run scripts/gpu_setup.sh here and carry .gpu" >&2
    return 1 2>/dev/null || exit 1
fi
OG_SITE=${OG_SITE:-/tmp/og-site}
if [ ! -f "$OG_SITE/.complete" ]; then
    rm -rf "$OG_SITE" && mkdir -p "$OG_SITE"
    tar -C "$OG_SITE" -xJf .gpu/site.tar.xz && touch "$OG_SITE/.complete"
fi
export OG_SITE
# omnigraph's entry points (its built-in backends, tasks, transports...) from this checkout's pyproject.toml
python3 scripts/dist_info.py "$OG_SITE" >/dev/null
export PYTHONPATH="$OG_SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 RAY_DEDUP_LOGS=0
export OMNIGRAPH_CACHE=${OMNIGRAPH_CACHE:-/tmp/og-cache}
if [ -d .gpu/cache/models ]; then            # the tiny model, built by gpu_setup.sh: no warm-start here
    mkdir -p "$OMNIGRAPH_CACHE/models"
    for d in .gpu/cache/models/*/; do
        [ -e "$OMNIGRAPH_CACHE/models/$(basename "$d")" ] || cp -r "$d" "$OMNIGRAPH_CACHE/models/"
    done
fi
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# NVLink multicast stays off on these machines (KINDS.md): keep it so in every child process too
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OG_PY=${OG_PY:-python3}
export OG_PY
omnigraph() { "$OG_PY" -m omnigraph.cli "$@"; }
