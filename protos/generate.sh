#!/usr/bin/env bash
# Regenerate hacrl_fed/v1/*_pb2*.py from protos/. Needs the dev extra (grpcio-tools<1.82).
# Usage: bash protos/generate.sh [OUT_DIR]   (OUT_DIR defaults to the repository root)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root}"
python -m grpc_tools.protoc -I "$root/protos" \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  "$root"/protos/hacrl_fed/v1/rollout.proto "$root"/protos/hacrl_fed/v1/worker.proto
