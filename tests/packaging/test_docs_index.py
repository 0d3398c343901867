"""The documents find each other: docs/index.md lists every document of docs/ (and the API
reference's pages), README.md links the index and the API reference, and its install section
says how to install shardline while it is not on PyPI."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from support.paths import ROOT

DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def links(path: Path) -> set[Path]:
    """The local files ``path`` links to, resolved."""
    text = path.read_text(encoding="utf-8")
    return {
        (path.parent / target).resolve() for target in LINK.findall(text) if "://" not in target
    }


def section(text: str, heading: str) -> str:
    assert heading in text, f"README.md lost its section {heading!r}"
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def test_the_docs_index_lists_every_document_of_docs() -> None:
    listed = links(DOCS / "index.md")
    documents = {path.resolve() for path in DOCS.glob("*.md") if path.name != "index.md"}
    assert documents - listed == set(), "docs/index.md does not list these"
    assert (DOCS / "api" / "index.rst").resolve() in listed


def test_every_link_of_the_docs_index_reaches_a_file() -> None:
    assert [path for path in links(DOCS / "index.md") if not path.exists()] == []


def test_every_page_of_the_api_reference_is_in_its_table_of_contents() -> None:
    index = (DOCS / "api" / "index.rst").read_text(encoding="utf-8")
    entries = set(index.split(".. toctree::", 1)[1].split())
    pages = {path.stem for path in (DOCS / "api").glob("*.rst")} - {"index"}
    assert pages <= entries


def test_the_readme_links_the_docs_index_and_the_api_reference() -> None:
    readme = links(ROOT / "README.md")
    assert (DOCS / "index.md").resolve() in readme
    assert (DOCS / "api" / "index.rst").resolve() in readme


def test_the_readme_installs_from_a_built_wheel_while_shardline_is_not_on_pypi() -> None:
    install = section((ROOT / "README.md").read_text(encoding="utf-8"), "## Install\n")
    commands = install.split("```sh\n", 1)[1].split("```", 1)[0]
    assert "make wheel" in commands
    assert re.search(r"pip install \"\$\(echo dist/shardline-\*\.whl\)\[pg\]\"", commands)
    # the index's name is said to come later, never given as the command to run now
    assert not re.search(r"^pip install \"?shardline\[", commands, re.MULTILINE)
    assert "not published on PyPI" in install


def test_the_project_names_no_urls_until_a_public_address_exists() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "urls" not in project
