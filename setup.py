from pathlib import Path

from setuptools import find_packages, setup

requirements = [
    line.split("#")[0].strip()
    for line in Path(__file__).with_name("requirements.txt").read_text().splitlines()
    if line.split("#")[0].strip()
]

setup(
    name="open_clip_adacl",
    version="0.1.0",
    description="OpenCLIP fork for CLIP pretraining with the AdaCL loss (clone negatives) and its peers",
    package_dir={"": "src"},
    packages=find_packages("src"),
    package_data={"open_clip_adacl": ["model_configs/*.json"]},
    python_requires=">=3.10",
    install_requires=requirements,
    extras_require={"test": ["pytest", "pytest-timeout"]},
    entry_points={
        "console_scripts": [
            "adacl-train=training.main:cli",
            "adacl-export=training.export:cli",
            "adacl-evaluate=training.evaluate:cli",
            "adacl-torchrun=training.torchrun:cli",
        ]
    },
)
