"""Build hook: package the top-level models.toml (the one catalogue) as localchat/models/models.toml.

Everything else is configured in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CATALOGUE = "models.toml"
PACKAGED_AS = Path("localchat", "models", "models.toml")


class BuildWithCatalogue(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / PACKAGED_AS
        target.parent.mkdir(parents=True, exist_ok=True)
        self.copy_file(CATALOGUE, str(target))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PACKAGED_AS)]


setup(cmdclass={"build_py": BuildWithCatalogue})
