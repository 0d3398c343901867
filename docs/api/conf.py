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
from typing import Any, TypeVar

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.ext.napoleon import _process_docstring as napoleon_docstring
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import make_refnode

import shardline
from shardline import _core

project = "shardline"
author = "the shardline authors"
release = version = shardline.__version__
# napoleon reads the "Args:" sections; "Implementation notes:" stays a definition list
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
napoleon_numpy_docstring = False
# the types are in the signatures; as ``:type:`` fields they would be parsed again, and a
# ``Callable[[], T]`` there breaks the parser
napoleon_attr_annotations = False
# builtin ``type`` in a signature is looked up among attributes too, and two are named so
suppress_warnings = ["ref.python"]
html_theme = "alabaster"
html_title = f"shardline {release}: API reference"
autodoc_default_options = {"show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# defaults as the source writes them: a repr (``<class ...>``) is no Python, and a signature
# that does not parse loses its links
autodoc_preserve_defaults = True

logger = logging.getLogger(__name__)

# Every reference is checked (nitpicky), but those to other projects' objects: the build is
# offline (no intersphinx inventories), so those name their target without a link.
nitpicky = True
_EXTERNAL = (
    "_asyncio",
    "abc",
    "asyncio",
    "asyncpg",
    "collections",
    "concurrent",
    "enum",
    "grpc",
    "logging",
    "os",
    "pathlib",
    "prometheus_client",
    "random",
    "socket",
    "sqlite3",
    "ssl",
    "typing",
    "uuid",
)
nitpick_ignore_regex = [(r"py:.*", rf"({'|'.join(_EXTERNAL)})(\..*)?")]

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
def _exported_at_home(value: Any) -> bool:
    """Whether the module ``value`` says it comes from documents it: it is a public module
    that lists it in ``__all__`` (the Rust core's classes say ``shardline``, or a private
    module)."""
    home = getattr(value, "__module__", None) or "shardline"
    if _private(home):
        return False
    exported = getattr(importlib.import_module(home), "__all__", ())
    return any(getattr(importlib.import_module(home), member, None) is value for member in exported)


@functools.cache
def _owners() -> dict[int, str]:
    """For each object public modules export but its own module does not document (the Rust
    core's classes, ``WorkersView`` among them), the one that documents it: the shortest name
    (``shardline`` before its subpackages)."""
    owners: dict[int, str] = {}
    for name in sorted(public_modules("shardline"), key=lambda n: (n.count("."), n)):
        module = importlib.import_module(name)
        for member in getattr(module, "__all__", ()):
            value = getattr(module, member)
            if (inspect.isclass(value) or inspect.isroutine(value)) and not _exported_at_home(
                value
            ):
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
            keep = _owners().get(id(value), home) == name
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


def google_sections_but_on_attributes(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """napoleon's reading of ``Args:`` sections, on every docstring but an attribute's:
    napoleon would read its first line ``text: more`` as ``type: description`` (the types
    here come from the annotations, and no attribute has a section)."""
    if what not in ("attribute", "data", "property"):
        napoleon_docstring(app, what, name, obj, options, lines)


def _lookup(target: str) -> tuple[Any, list[str]] | None:
    """The object ``target`` names (a module's member), with the rest of the path below it;
    None when no module has it."""
    parts = target.split(".")
    for end in range(len(parts) - 1, 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        if not hasattr(module, parts[end]):
            return None
        return getattr(module, parts[end]), parts[end + 1 :]
    return None


def _documented_names(env: BuildEnvironment, target: str) -> list[str]:
    """Where the reference ``target`` (``shardline.WorkerProxy.explain``, a name as a package
    re-exports it) may be documented: the module that defines the object, or its owner; for a
    member, also the class of its ``__mro__`` that defines it; for a value, the documented
    names of that very object."""
    found = _lookup(target)
    if found is None:
        return []
    value, rest = found
    if inspect.isclass(value) or inspect.isroutine(value):
        home = _owners().get(id(value), value.__module__)
        names = [".".join([home, value.__name__, *rest])]
        if inspect.isclass(value) and len(rest) == 1:
            names += [
                f"{base.__module__}.{base.__qualname__}.{rest[0]}"
                for base in value.__mro__[1:]
                if rest[0] in vars(base)
            ][:1]
        return names
    if rest:
        return []
    suffix = "." + target.rpartition(".")[2]
    return [
        name
        for name in env.get_domain("py").objects
        if name.endswith(suffix) and (_lookup(name) or (None, []))[0] is value
    ]


def _candidates(node: pending_xref, target: str) -> list[str]:
    """The names ``target``, written in ``node``'s docstring, may mean, most specific first:
    as written when it names a shardline object, else within the class and the module the
    docstring is in."""
    if target.startswith("shardline."):
        return [target]
    module, owner = node.get("py:module"), node.get("py:class")
    scopes = [f"{module}.{owner}", module] if module and owner else [module] if module else []
    return [f"{scope}.{target}" for scope in scopes]


def _unique_suffix(env: BuildEnvironment, target: str) -> str | None:
    """The one documented object whose full name ends with ``target`` (``Topology.apply``,
    ``MAX_RECORD_BYTES``), None when none or several do."""
    suffix = "." + target
    found = [name for name in env.get_domain("py").objects if name.endswith(suffix)]
    return found[0] if len(found) == 1 else None


def _type_checking_import(target: str) -> str | None:
    """Where ``module.name`` comes from when ``module`` imports ``name`` for type checking
    only (``if TYPE_CHECKING:``): ``source.name``, None when it does not."""
    module_name, _, name = target.rpartition(".")
    try:
        tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    except (ImportError, OSError, TypeError):
        return None
    for statement in tree.body:
        if isinstance(statement, ast.If) and ast.unparse(statement.test) == "TYPE_CHECKING":
            for imported in statement.body:
                if (
                    isinstance(imported, ast.ImportFrom)
                    and imported.module
                    and any((alias.asname or alias.name) == name for alias in imported.names)
                ):
                    return f"{imported.module}.{name}"
    return None


def _undocumented_on_purpose(target: str) -> bool:
    """A private name (a module, class or member whose name starts with ``_``), a class of
    the Rust core the package does not export (a base class), a type variable, or another
    project's object as a module imports it (for type checking only or not): text, never in
    the reference."""
    if _private(target):
        return True
    package, _, name = target.partition(".")
    if package == "shardline" and hasattr(_core, name) and not hasattr(shardline, name):
        return True
    found = _lookup(target)
    if found is not None:
        home = getattr(found[0], "__module__", None) or "shardline"
        return isinstance(found[0], TypeVar) or home.partition(".")[0] != "shardline"
    source = _type_checking_import(target)
    return source is not None and not source.startswith("shardline.")


def _documented(env: BuildEnvironment, node: pending_xref, target: str) -> list[str]:
    """The documented names ``target``, written in ``node``'s docstring, may be: a name as a
    package re-exports it, as the module imports it (for type checking only or not), a
    member where its class inherits it from, or a short name only one documented object ends
    with."""
    candidates = _candidates(node, target)
    names = [name for candidate in candidates for name in _documented_names(env, candidate)]
    names += [
        name
        for candidate in candidates
        if (imported := _type_checking_import(candidate)) is not None
        for name in _documented_names(env, imported)
    ]
    unique = _unique_suffix(env, target)
    return names if unique is None else [*names, unique]


def _owning_classes(env: BuildEnvironment, node: pending_xref, target: str) -> list[str]:
    """For a member with no entry of its own (a dataclass field, an attribute of the Rust
    core, a method without a docstring), its documented class, if the class has it."""
    if node.get("reftype") not in ("attr", "meth", "data", "obj"):
        return []
    owner, _, member = target.rpartition(".")
    if owner:
        classes = _documented(env, node, owner)
    elif node.get("py:module") and node.get("py:class"):
        classes = _documented_names(env, f"{node['py:module']}.{node['py:class']}")
    else:
        return []
    return [
        name
        for name in classes
        if (found := _lookup(name)) is not None and not found[1] and hasattr(found[0], member)
    ]


def resolve_reexport(
    app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.Element
) -> nodes.Element | None:
    """Resolves a reference the Python domain did not find to the object's documented place
    (:func:`_documented`), so the docstrings' short paths link, or else to the class of a
    member without an entry of its own. A private name, a type variable or another
    project's object is left as text; anything else stays unresolved (a warning)."""
    if node.get("refdomain") != "py":
        return None
    objects = env.get_domain("py").objects
    target = node.get("reftarget", "").lstrip("~.")
    for name in [*_documented(env, node, target), *_owning_classes(env, node, target)]:
        entry = objects.get(name)
        if entry is not None:
            return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode)
    if any(_undocumented_on_purpose(candidate) for candidate in _candidates(node, target)):
        return contnode
    return None


def check_every_module_has_a_page(app: Sphinx, env: BuildEnvironment) -> None:
    missing = sorted(set(public_modules("shardline")) - getattr(env, "shardline_modules", set()))
    if missing:
        logger.warning("public modules in no page of the API reference: %s", ", ".join(missing))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("package-modules", PackageModules)
    for listener in list(app.events.listeners["autodoc-process-docstring"]):
        if listener.handler is napoleon_docstring:
            app.disconnect(listener.id)
    app.connect("autodoc-process-docstring", google_sections_but_on_attributes)
    app.connect("missing-reference", resolve_reexport)
    app.connect("env-check-consistency", check_every_module_has_a_page)
    # the pages record the modules they hold in the environment, which parallel reads split
    return {"parallel_read_safe": False}
