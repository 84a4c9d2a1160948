"""The distribution: its name is free on PyPI, it ships every package, and no generic one.

``brokerkit`` on PyPI is another project, so the distribution is ``brokerkit-mq`` (the
import name stays ``brokerkit``). The contract suite, the repository's ``contract_tests/``,
installs as ``brokerkit_contract``: a top-level ``contract_tests`` would collide.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PROJECT["tool"]["setuptools"]
OLD_EXTRA = "'brokerkit" + "["  # spelled in two halves, so this file does not match itself


def test_the_distribution_is_brokerkit_mq_and_its_extras_name_it() -> None:
    assert PROJECT["project"]["name"] == "brokerkit-mq"
    for extra, needs in PROJECT["project"]["optional-dependencies"].items():
        own = [n for n in needs if n.startswith("brokerkit")]
        assert all(n.startswith("brokerkit-mq[") for n in own), (extra, own)
    assert PROJECT["project"]["scripts"] == {"brokerkit": "brokerkit._cli:main"}


def test_every_package_under_brokerkit_ships() -> None:
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "brokerkit").rglob("__init__.py")
    }
    assert found <= set(SETUPTOOLS["packages"]), found - set(SETUPTOOLS["packages"])


def test_the_suite_ships_as_brokerkit_contract_not_contract_tests() -> None:
    assert SETUPTOOLS["package-dir"] == {"brokerkit_contract": "contract_tests"}
    assert "brokerkit_contract" in SETUPTOOLS["packages"]
    assert not [p for p in SETUPTOOLS["packages"] if p.split(".")[0] == "contract_tests"]
    subpackages = {
        ".".join(("brokerkit_contract", *p.parent.relative_to(ROOT / "contract_tests").parts))
        for p in (ROOT / "contract_tests").rglob("__init__.py")
    }
    assert subpackages <= set(SETUPTOOLS["packages"]), subpackages - set(SETUPTOOLS["packages"])
    data = PROJECT["tool"]["setuptools"]["package-data"]["brokerkit_contract"]
    assert all((ROOT / "contract_tests" / f).is_file() for f in data)


def test_the_suite_imports_itself_relatively_so_either_name_works() -> None:
    for path in (ROOT / "contract_tests").rglob("*.py"):  # subpackages too (_raw)
        for line in path.read_text().splitlines():
            assert not line.startswith(("from contract_tests", "import contract_tests")), (
                str(path.relative_to(ROOT)),
                line,
            )


def test_the_documented_install_names_the_distribution() -> None:
    for doc in ("README.md", "docs/index.md"):
        text = (ROOT / doc).read_text()
        # nothing is on PyPI yet: the checkout first, the distribution's name for later
        checkout, index = "pip install -e '.[redis", "pip install 'brokerkit-mq[redis"
        assert checkout in text and index in text, doc
        assert text.index(checkout) < text.index(index), doc
        assert "release" in text[text.index(index) - 300 : text.index(index) + 100], doc
    for path in [
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "brokerkit").rglob("*.py"),
    ]:
        assert OLD_EXTRA not in path.read_text(), path  # the old distribution's name


def test_check_without_pytest_says_which_extra_to_install() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['pytest'] = None\n"  # as if the check extra were missing
        "from brokerkit._cli import main; main(['check', 'memory://'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert "pip install 'brokerkit-mq[check]'" in done.stderr and "Traceback" not in done.stderr
