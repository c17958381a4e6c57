"""Which prediction a server's accept length follows: averaged over positions, or walked round by round.

    python benchmarks/accept_walk.py [--demo DIR] [--new-tokens 32] [--measured RUN_DIR ...]

test-drafter reports two figures per layout: ``1 + sum_k full_acc_k`` (the average over every
position, speculators' figure) and the decoding walk (``remote.drafter.scoring.metrics.walk``: the rounds a
greedy server would make over the same text). This script scores the demo draft, with the ids it
was trained on and with the ids its config names, on two texts:

* the demo's dumps (what `invoke test-drafter` scores): 4 random prompt tokens, then text the target
  sampled at temperature 0.35;
* greedy dumps of the benchmark's own prompts (``<demo>/bench-prompts.jsonl``): the target's greedy
  continuation, up to ``--new-tokens`` tokens and stopping at EOS, which is exactly the text a greedy
  server generates for `invoke bench --dataset demo --output-len N`.

``--measured`` takes `invoke bench` run folders (``runs/<id>``) and prints their measured accept
length and draft ids beside the table. docs/bench.md § Measured against predicted holds the result.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def greedy_dumps(demo: Path, out: Path, new_tokens: int) -> tuple[int, int]:
    """Write one legacy .pt dump per bench prompt: prompt + greedy continuation; returns (files, tokens)."""
    import torch

    from remote.drafter.demo import wordtokenizer
    from remote.drafter.model import tinyllama

    cfg, weights = tinyllama.load(demo / "target")
    data_config = json.loads((demo / "data" / "data_config.json").read_text())
    slot_ids = data_config["layer_ids"]
    prompts = [json.loads(line)["prompt"] for line in (demo / "bench-prompts.jsonl").read_text().splitlines()
               if line.strip()]
    eos = wordtokenizer.SPECIALS.index("</s>")
    out.mkdir(parents=True, exist_ok=True)
    generated = 0
    for i, text in enumerate(prompts):
        prompt = wordtokenizer.encode(text, cfg.vocab_size)
        new = tinyllama.greedy(cfg, weights, prompt, new_tokens)
        if eos in new:
            new = new[: new.index(eos) + 1]
        ids = torch.tensor([prompt + new])
        with torch.no_grad():
            states, _ = tinyllama.forward(cfg, weights, ids)
        slots = states[0][:, [s + 1 for s in slot_ids]]          # SGLang id i = the state after i+1 layers
        mask = (torch.arange(ids.shape[1]) >= len(prompt)).long()  # generated tokens, as in the demo's dumps
        torch.save({"input_ids": ids[0].clone(), "loss_mask": mask,
                    "hidden_states": [slots[:, s].clone() for s in range(slots.shape[1])]}, out / f"data_{i}.pt")
        generated += len(new)
    (out / "data_config.json").write_text(json.dumps(data_config, indent=2) + "\n")
    return len(prompts), generated


def evaluate(demo: Path, ckpt: str, data: Path, out: Path) -> dict:
    """`python -m remote.drafter eval` on ``data``; the report's served layout, both figures."""
    subprocess.run([sys.executable, "-m", "remote.drafter", "eval", "--ckpt", str(demo / ckpt), "--data", str(data),
                    "--verifier", str(demo / "target"), "--steps", "3", "--device", "cpu", "--out", str(out)],
                   cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report = json.loads((out / "report.json").read_text())
    served = report["metrics"]["served"]
    counts = served["verifier"]
    return {"layer_ids": served["layer_ids"], "positions": 1 + sum(a or 0 for a in counts["full_acc"]),
            "walk": counts["walk"]["accept_length"], "rounds": counts["walk"]["rounds"]}


def measured(run: Path) -> str:
    result = json.loads((run / "bench-result.json").read_text())
    accept = (result.get("accept_length") or {}).get("value")
    draft = result.get("draft") or {}
    return f"{run.name}: measured accept length {accept:.3f}, draft layer ids {draft.get('layer_ids')}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", type=Path, default=REPO / ".draftops" / "state" / "demo",
                        help="a complete demo (default: the local host's, made by `invoke test-drafter`)")
    parser.add_argument("--new-tokens", type=int, default=32, help="the bench's --output-len (32)")
    parser.add_argument("--measured", type=Path, nargs="*", default=[], help="`invoke bench` run folders")
    args = parser.parse_args()
    if not (args.demo / "bench-prompts.jsonl").is_file():
        parser.error(f"{args.demo} holds no complete demo with bench prompts; run `invoke test-drafter` first")
    with tempfile.TemporaryDirectory() as tmp:
        files, tokens = greedy_dumps(args.demo, Path(tmp) / "greedy", args.new_tokens)
        print(f"greedy dumps: {files} bench prompts, {tokens} generated tokens "
              f"(up to {args.new_tokens} each, EOS ends)")
        print(f"{'text':<34} {'layer ids (SGLang)':<20} {'positions':>9} {'walk':>7} {'rounds':>7}")
        for text, data in (("demo dumps (sampled, T=0.35)", args.demo / "data"),
                           ("greedy text of the bench prompts", Path(tmp) / "greedy")):
            for ckpt in ("draft", "draft_fixed"):
                row = evaluate(args.demo, ckpt, data, Path(tmp) / f"out-{ckpt}-{data.name}")
                print(f"{text:<34} {str(row['layer_ids']):<20} {row['positions']:>9.3f} {row['walk']:>7.3f} "
                      f"{row['rounds']:>7}")
    for run in args.measured:
        print(measured(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
