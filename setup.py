from setuptools import find_packages, setup

# Compatible ranges, so that installing beside a cluster's stack keeps its torch; the exact versions
# the tests pass with are in constraints.txt (scripts/setup_env.sh installs with them).
# The library (`import open_clip_adacl`, `create_loss`): torch and the open_clip whose losses and models it extends.
INSTALL_REQUIRES = [
    # torch.amp.GradScaler(device=...) and torch.load(mmap=...) need 2.3; tested with 2.14.
    "torch>=2.3",
    # open_clip 4.x rewrote training around "tasks"; we import open_clip_train's 3.x pieces.
    "open_clip_torch>=3.3,<4",
]

EXTRAS_REQUIRE = {
    # The trainer (`python -m training.main` and its tools), as OpenCLIP keeps open_clip_train's behind [training].
    "training": [
        "torchvision>=0.18",  # the pair of torch 2.3
        # Exactly 0.2.86: the oldest our pipeline is tested with, and the newest open_clip_torch[training] accepts
        # (<=0.2.86). Left open, pip picks 1.0.x, whose end-of-shard markers make stock open_clip_train's tar
        # pipeline die with KeyError: 'fname' (so does 0.2.96); the README promises both trainers run from one
        # environment (tests/test_packaging.py checks the range).
        "webdataset==0.2.86",
        "braceexpand",
        "numpy",
        "pandas",  # open_clip_train.data imports it at load time
        "pillow",
        "huggingface_hub",
        "safetensors",
        "tensorboard",
        "tqdm",
    ],
    # Evaluation (training.evaluation.zero_shot, the demo's table) and plots; clip_benchmark pulls transformers,
    # scikit-learn and pycocoevalcap, which training does not need.
    "eval": [
        "clip-benchmark>=1.6.2,<2",
        "numpy<2.4",  # numpy >= 2.4 breaks clip_benchmark 1.6.2's zero-shot accuracy
        "requests",  # clip_benchmark.cli imports it
        "matplotlib",
        "scipy",  # paired-t intervals: the benchmarks' (training.trainer.timing) and the lab's comparisons
        # Exactly 1.4.2: the lab's icon data set (studies.icons, docs/icons.md) is defined by the Material Design
        # Icons 6.9.96 font and charmap this wheel ships (another version renames, adds or redraws icons, and so
        # changes the families). The lab reads the two files; it never imports qtawesome (that needs a Qt binding).
        "qtawesome==1.4.2",
    ],
    "wandb": ["wandb"],
    "test": ["pytest", "pytest-timeout", "pytest-xdist", "packaging", "ruff"],  # ruff: the linter .ci/run runs
}

setup(
    name="open_clip_adacl",
    version="0.1.0",
    description="OpenCLIP fork for CLIP pretraining with the AdaCL loss (clone negatives) and its peers",
    # Two top-level packages, the library (open_clip_adacl) and the trainer (training, whose tools are
    # its subpackages), so nothing generic lands in site-packages (README.md, "Layout"). The laboratory
    # (studies/, beside src/) stays in the repository: it is no package of the wheel.
    package_dir={"": "src"},
    packages=find_packages("src"),
    package_data={"open_clip_adacl": ["model_configs/*.json"], "training.discover": ["page.html"]},
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    entry_points={
        "console_scripts": [
            "adacl-train=training.main:cli",
            "adacl-export=training.export:cli",
            "adacl-evaluate=training.evaluation.__main__:cli",
            "adacl-scenes=training.synthetic_scenes.cli:main",
            "adacl-torchrun=training.torchrun:cli",
            "adacl-discover=training.discover.cli:cli",
        ]
    },
)
