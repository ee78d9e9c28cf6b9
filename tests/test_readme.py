"""The README's first screen (everything before its first `---`): the two set-up commands, and advice that agrees
with what the demo trains and with the findings' first lines."""

import re
from pathlib import Path

from training.trainer.launch.recipes import recipe_values

ROOT = Path(__file__).resolve().parents[1]


def first_screen() -> str:
    return (ROOT / "README.md").read_text().split("\n---\n", 1)[0]


def test_the_first_screen_holds_exactly_the_two_set_up_commands():
    [block] = re.findall(r"```bash\n(.*?)```", first_screen(), flags=re.S)
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert len(first_screen().splitlines()) <= 30


def test_the_advice_names_the_loss_the_demo_trains_beside_clip():
    demo = recipe_values("demo", world_size=1, batch_size_given=False)
    flags = f"--loss {demo['loss']} --adaclw-discovery {demo['adaclw_discovery']}"
    joined = " ".join(first_screen().split())
    assert "Train with `--loss clip`" in joined and f"`{flags}`" in joined
    findings = " ".join((ROOT / "docs" / "findings.md").read_text().split("\n## ", 1)[0].split())
    assert "train with `--loss clip`" in findings and f"`{flags}`" in findings
    demo_script = (ROOT / "scripts" / "demo.sh").read_text()
    assert "train_and_evaluate adaclw" in demo_script and "train_and_evaluate clip" in demo_script
