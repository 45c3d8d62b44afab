"""A griffe extension for the API reference: turns the Sphinx roles of the docstrings into links.

The docstrings are Google style with Sphinx's cross-reference roles (:mod:`.data`,
:class:`~rpc_collectors.pools.pool.WorkerPool`, :meth:`close`). Without this, Markdown would show
them as ":mod:" followed by the target in code. Each role becomes an optional autoref to the
object it names, resolved the way Python would find the name from where the docstring is (the
object, its parents, then what its module imports): a link where the target is rendered in the
reference, the name in code where it is not (a private helper), and never a strict-mode warning.

mkdocs.yml loads it with ``extensions: [docs/_ext/sphinx_roles.py:SphinxRoles]``.
"""
from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:mod|class|func|meth|attr|exc|data|obj):`(?P<target>[^`]+)`")


def _member(obj: Any, dotted: str) -> Any:
    """``obj``'s member at the dotted path ``dotted``, following imports; None if there is none."""
    for part in dotted.split("."):
        try:
            obj = obj.members[part]
            if obj.is_alias:
                obj = obj.final_target
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None
    return obj


def _module(obj: Any) -> Any:
    while not obj.is_module:
        obj = obj.parent
    return obj


def _resolve(obj: Any, target: str, root: Any) -> Any:
    """The object that ``target`` names in the docstring of ``obj``, or None."""
    if target.startswith("."):  # relative to the package of the docstring's module
        module = _module(obj)
        base = module if module.is_init_module else module.parent
        level = len(target) - len(target.lstrip("."))
        for _ in range(level - 1):
            base = base.parent
        return _member(base, target.lstrip("."))
    head, _, rest = target.partition(".")
    if head == root.name:
        return _member(root, rest) if rest else root
    scope = obj
    while scope is not None:  # the object, the class around it, its module, then the packages up
        found = _member(scope, target)
        if found is not None:
            return found
        scope = scope.parent
    return None


def _replace(obj: Any, text: str, root: Any) -> str:
    def link(match: re.Match) -> str:
        target = match["target"].strip().removesuffix("()")
        short = target.startswith("~")
        target = target.lstrip("~")
        title = target.rsplit(".", 1)[-1] if short else target.lstrip(".")
        found = _resolve(obj, target, root)
        if found is None:
            return f"``{title}``"
        ident = html.escape(found.path, quote=True)
        return f'<autoref identifier="{ident}" optional><code>{html.escape(title)}</code></autoref>'

    return ROLE.sub(link, text)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles in every docstring of a package once the package is loaded."""

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        stack = [pkg]
        while stack:
            obj = stack.pop()
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = _replace(obj, obj.docstring.value, pkg)
            stack.extend(member for member in obj.members.values() if not member.is_alias)
