"""Write Python with a trained charlm model: the run's exported EMA weights continue a prompt.

    python -m examples.charlm.sample runs/charlm --prompt "def " --characters 300

The model's sizes come from the run's recorded spec (RUN_DIR/job.yaml), its weights from
RUN_DIR/model.pt, which the job exports when it finishes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import yaml

from elfes.launcher.rundir.paths import RunPaths
from examples.charlm.data import VOCABULARY, encode
from examples.charlm.job import DEFAULTS
from examples.charlm.model import CharTransformer


@torch.no_grad()
def sample(model: CharTransformer, prompt: str, characters: int, temperature: float, seed: int) -> str:
    """``prompt`` and ``characters`` more, each drawn from the model's distribution at ``temperature``."""
    generator = torch.Generator().manual_seed(seed)
    tokens = encode(prompt)[None]
    for _ in range(characters):
        logits = model(tokens[:, -model.context:])[0, -1] / temperature
        drawn = torch.multinomial(logits.softmax(-1), 1, generator=generator)
        tokens = torch.cat([tokens, drawn[None]], dim=1)
    return "".join(map(chr, tokens[0].tolist()))


def load_model(run_dir: Path) -> CharTransformer:
    paths = RunPaths(run_dir)
    weights = paths.run_dir / "model.pt"
    if not paths.spec.is_file() or not weights.is_file():
        raise SystemExit(f"{weights} is missing: {run_dir} holds no finished charlm run; "
                         f"`elfes status {run_dir}` tells where it stands")
    config = {**DEFAULTS, **yaml.safe_load(paths.spec.read_text())["config"]}
    model = CharTransformer(VOCABULARY, config["context"], config["width"], config["depth"], config["heads"],
                            dropout=0.0)
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.charlm.sample", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("--prompt", default="def ")
    parser.add_argument("--characters", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args(argv)
    if not arguments.prompt or arguments.characters < 1 or arguments.temperature <= 0:
        parser.error("--prompt must not be empty, --characters must be 1 or more and --temperature above 0")
    model = load_model(arguments.run_dir)
    print(sample(model, arguments.prompt, arguments.characters, arguments.temperature, arguments.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
