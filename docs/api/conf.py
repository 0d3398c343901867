"""Sphinx configuration of shardline's API reference: the docstrings of every public module
(autodoc), one page per package. ``make docs`` builds it into ``target/docs/html`` with every
warning an error."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
from types import ModuleType
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import make_refnode

import shardline

project = "shardline"
author = "the shardline authors"
release = version = shardline.__version__
# napoleon reads the "Args:" sections; "Implementation notes:" stays a definition list
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
napoleon_numpy_docstring = False
# builtin ``type`` in a signature is looked up among attributes too, and two are named so
suppress_warnings = ["ref.python"]
html_theme = "alabaster"
html_title = f"shardline {release}: API reference"
autodoc_default_options = {"show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"

logger = logging.getLogger(__name__)

# the command line and the demo are documented as commands (README.md, docs/demo.md)
NOT_API = ("shardline.cli", "shardline.demo")


def _private(name: str) -> bool:
    return any(part.startswith("_") for part in name.split("."))


def public_modules(package: str, *, recursive: bool = True) -> list[str]:
    """``package`` and the public modules below it (and the subpackages', if ``recursive``)."""
    path = importlib.import_module(package).__path__
    below = (
        pkgutil.walk_packages(path, f"{package}.")
        if recursive
        else pkgutil.iter_modules(path, f"{package}.")
    )
    return sorted(
        [package]
        + [
            info.name
            for info in below
            if not (info.ispkg and not recursive)
            and not _private(info.name)
            and not info.name.startswith(NOT_API)
        ]
    )


@functools.cache
def _owners() -> dict[int, str]:
    """For each object of a private module (the Rust core's classes) that public modules
    export, the one that documents it: the shortest name (``shardline`` before its
    subpackages)."""
    owners: dict[int, str] = {}
    for name in sorted(public_modules("shardline"), key=lambda n: (n.count("."), n)):
        module = importlib.import_module(name)
        for member in getattr(module, "__all__", ()):
            value = getattr(module, member)
            if _private(getattr(value, "__module__", None) or "shardline"):
                owners.setdefault(id(value), name)
    return owners


def _assigned(module: ModuleType) -> set[str]:
    """The names a module's own source assigns at its top level (its constants)."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return set()
    names: set[str] = set()
    for statement in tree.body:
        targets = (
            statement.targets
            if isinstance(statement, ast.Assign)
            else [statement.target]
            if isinstance(statement, ast.AnnAssign)
            else []
        )
        names.update(target.id for target in targets if isinstance(target, ast.Name))
    return names


def documented_members(name: str) -> list[str]:
    """The members ``name``'s page documents: each public object once, where it is defined,
    or for an object of a private module, where :func:`_owners` says."""
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        exported = [member for member in vars(module) if not member.startswith("_")]
    assigned = _assigned(module)
    members = []
    for member in exported:
        value = getattr(module, member)
        home = getattr(value, "__module__", None)
        if inspect.isclass(value) or inspect.isroutine(value):
            keep = home == name or (_private(home or "") and _owners().get(id(value)) == name)
        else:
            keep = member in assigned
        if keep:
            members.append(member)
    return members


class PackageModules(SphinxDirective):
    """``.. package-modules:: shardline.transport``: an ``automodule`` of the package and of
    each public module in it (its subpackages have pages of their own), so a new module is in
    the reference without a page edit; a new package without a page is a warning."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        lines = StringList()
        source = self.get_source_info()[0]
        modules = public_modules(self.arguments[0], recursive=False)
        paged = getattr(self.env, "shardline_modules", set())
        self.env.shardline_modules = paged | set(modules)  # type: ignore[attr-defined]
        for name in modules:
            members = documented_members(name)
            text = [name, "-" * len(name), "", f".. automodule:: {name}"]
            if members:
                text.append(f"   :members: {', '.join(members)}")
            for line in [*text, ""]:
                lines.append(line, source)
        container = nodes.section()
        self.state.nested_parse(lines, self.content_offset, container, match_titles=True)
        return container.children


def _documented_name(target: str) -> str | None:
    """Where the reference ``target`` (``shardline.WorkerProxy.explain``, a name as a package
    re-exports it) is documented: the module that defines the object, or its owner."""
    parts = target.split(".")
    for end in range(len(parts) - 1, 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        value = getattr(module, parts[end], None)
        if not (inspect.isclass(value) or inspect.isroutine(value)):
            return None
        home = value.__module__
        if _private(home):
            home = _owners().get(id(value), home)
        return ".".join([home, value.__name__, *parts[end + 1 :]])
    return None


def resolve_reexport(
    app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.Element
) -> nodes.Element | None:
    """Resolves a reference to a re-exported name (``~shardline.WorkerProxy``) to the object's
    documented place, so the docstrings' short paths link."""
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith("shardline."):
        return None
    name = _documented_name(target)
    entry = None if name is None else env.get_domain("py").objects.get(name)
    if entry is None:
        return None
    return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode)


def check_every_module_has_a_page(app: Sphinx, env: BuildEnvironment) -> None:
    missing = sorted(set(public_modules("shardline")) - getattr(env, "shardline_modules", set()))
    if missing:
        logger.warning("public modules in no page of the API reference: %s", ", ".join(missing))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("package-modules", PackageModules)
    app.connect("missing-reference", resolve_reexport)
    app.connect("env-check-consistency", check_every_module_has_a_page)
    # the pages record the modules they hold in the environment, which parallel reads split
    return {"parallel_read_safe": False}
