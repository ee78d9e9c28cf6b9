"""What a run records of the code it ran and of the checkpoint it starts from, on real git repositories and
real run folders."""

import json
import subprocess
from pathlib import Path

import pytest

from studies.comparison.jobs import pretrained_identity
from training import RunDir
from training.trainer.run_folder import provenance

REPO = Path(__file__).resolve().parents[4]


def _git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True, capture_output=True
    )


def test_dirty_files_names_each_changed_path_with_the_hash_of_its_content(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "kept.py").write_text("a = 1\n")
    (tmp_path / "gone.py").write_text("b = 2\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "first")
    provenance.dirty_files.cache_clear()
    assert provenance.dirty_files(tmp_path) == {}
    (tmp_path / "kept.py").write_text("a = 3\n")
    (tmp_path / "gone.py").unlink()
    (tmp_path / "new.py").write_text("c = 4\n")
    provenance.dirty_files.cache_clear()
    dirty = provenance.dirty_files(tmp_path)
    assert dirty == {
        "gone.py": "deleted",
        "kept.py": provenance.file_digest(tmp_path / "kept.py"),
        "new.py": provenance.file_digest(tmp_path / "new.py"),
    }
    assert len(dirty["kept.py"]) == 12 and dirty["kept.py"] != dirty["new.py"]
    provenance.code_version.cache_clear()
    assert "+ diff" in provenance.code_version(tmp_path)
    provenance.dirty_files.cache_clear()
    provenance.code_version.cache_clear()


def _pretraining_run(root: Path, seed) -> Path:
    """A run folder whose last launch trained on scenes with a manifest of `seed`; its checkpoint."""
    data = root / "data"
    (data / "train").mkdir(parents=True)
    (data / "manifest.json").write_text(json.dumps({"seed": seed}))
    run = root / "pretrain" / "clip"
    (run / "checkpoints").mkdir(parents=True)
    (run / "params.json").write_text(
        json.dumps({"train_data": f"{data}/train/shard-{{000000..000003}}.tar", "seed": 1})
    )  # the last launch's (params.txt keeps every one)
    checkpoint = run / "checkpoints" / "epoch_2.pt"
    checkpoint.write_bytes(b"weights")
    return checkpoint


def test_a_fine_tuning_run_records_the_checkpoint_it_starts_from_and_its_data_seed(tmp_path):
    checkpoint = _pretraining_run(tmp_path, 1)
    assert RunDir(checkpoint.parent.parent).recorded_args()["train_data"].startswith(str(tmp_path / "data"))
    identity = pretrained_identity(["--lr", "1e-4", "--pretrained", str(checkpoint), "--epochs", "2"])
    assert identity == {"path": str(checkpoint), "sha256": provenance.file_digest(checkpoint), "data_seed": "1"}
    assert pretrained_identity([f"--pretrained={checkpoint}"]) == identity
    assert pretrained_identity(["--lr", "1e-4"]) is None
    assert pretrained_identity(["--pretrained", "openai"]) == {"path": "openai", "sha256": None, "data_seed": None}


def test_a_run_folder_is_reused_only_for_the_recipe_seed_data_seed_and_code_it_recorded(tmp_path):
    identity = provenance.training_identity("glyphs-pretrain", 1000, 0)
    assert identity == {"recipe": "glyphs-pretrain", "seed": 1000, "data_seed": 0, "code": provenance.code_version()}
    run = tmp_path / "pretrain" / "clip-seed1000"
    provenance.check_or_record_identity(run, identity)  # a new folder: recorded
    assert json.loads((run / provenance.IDENTITY_NAME).read_text()) == identity
    provenance.check_or_record_identity(run, identity)  # the same training: reusable
    with pytest.raises(ValueError, match=r"was trained otherwise \(seed 1000 there, 1001 here\); remove it to train"):
        provenance.check_or_record_identity(run, {**identity, "seed": 1001})
    with pytest.raises(ValueError, match=r"\(code '.*' there, 'git 0000000000' here\)"):
        provenance.check_or_record_identity(run, {**identity, "code": "git 0000000000"})
    with pytest.raises(ValueError, match=r"\(recipe 'glyphs-pretrain' there, 'demo' here; data_seed 0 there, 1 here\)"):
        provenance.check_or_record_identity(run, {**identity, "recipe": "demo", "data_seed": 1})
