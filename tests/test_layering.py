"""The import graph a reader can trust: no cycles, primitives at the bottom, the library below the parties and tools.

Read from the source (``ast``), not by importing: an import inside a function
counts as much as one at the top, since it ties the two modules together all
the same.
"""

from __future__ import annotations

from support import sourcetree as st

# what the primitives may lean on: leaf modules that import nothing above themselves
HAZMAT_MAY_IMPORT = {"secure_afl.exceptions", "secure_afl._validation", "secure_afl.domains"}
# installed sub-packages that are parties or tools, not library
ABOVE_LIBRARY = ("secure_afl.server", "secure_afl.clients", "secure_afl.keyholder", "secure_afl.flower",
                 "secure_afl.tools")
TOOLS = ("secure_afl.flower", "secure_afl.tools")


def _under(name: str, packages) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _graph() -> dict[str, set[str]]:
    graph = {name: set() for name in st.modules()}
    for m in st.modules().values():
        for _, target, _ in st.internal_imports(m):
            if target != m.name:
                graph[m.name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_two_module_cycle():
    # the check below is only as good as this function: a planted cycle must be reported
    assert _cycles({"a": {"b"}, "b": {"a", "c"}, "c": set()}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_hazmat_imports_nothing_above_it():
    offences = [f"{m.name} -> {t}" for m in st.modules().values() if _under(m.name, ["secure_afl.hazmat"])
                for _, t, _ in st.internal_imports(m)
                if not _under(t, ["secure_afl.hazmat"]) and t not in HAZMAT_MAY_IMPORT]
    assert not offences, "hazmat imports above itself:\n" + "\n".join(offences)


def test_the_library_imports_no_party_and_no_tool():
    offences = [f"{m.name} -> {t}" for m in st.modules().values() if not _under(m.name, ABOVE_LIBRARY)
                for _, t, _ in st.internal_imports(m) if _under(t, ABOVE_LIBRARY)]
    assert not offences, "the library imports a party or a tool:\n" + "\n".join(offences)


def test_no_party_imports_a_tool():
    offences = [f"{m.name} -> {t}" for m in st.modules().values()
                if _under(m.name, ABOVE_LIBRARY) and not _under(m.name, TOOLS)
                for _, t, _ in st.internal_imports(m) if _under(t, TOOLS)]
    assert not offences, "a party imports a tool:\n" + "\n".join(offences)


def test_the_library_has_no_network_code():
    import ast

    network = {"fastapi", "starlette", "httpx", "uvicorn", "requests", "socket", "flwr"}
    offences = []
    for m in st.modules().values():
        if _under(m.name, ABOVE_LIBRARY):
            continue
        for node in ast.walk(m.tree()):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            offences += [f"{m.name}: {n}" for n in names if n.partition(".")[0] in network]
    assert not offences, "network code in the library:\n" + "\n".join(offences)


def test_no_private_name_is_imported_across_modules():
    import ast

    offences = []
    for m in st.modules().values():
        for node in ast.walk(m.tree()):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = st.resolve(m, node)
            if base not in st.modules() or base == m.name:
                continue
            # a package's own __init__ may gather its submodules' names
            if m.is_package and base.startswith(m.name + "."):
                continue
            offences += [f"{m.name}:{node.lineno}: {base}.{a.name}" for a in node.names
                         if a.name.startswith("_") and not a.name.startswith("__")]
    assert not offences, "private names imported across modules:\n" + "\n".join(offences)


def test_no_two_modules_share_a_file_name_for_different_jobs():
    # the same name for the same job in each party's folder is fine: their command lines
    same_job = {"__init__", "cli"}
    seen: dict[str, list[str]] = {}
    for m in st.modules().values():
        if not m.is_package and m.path.stem not in same_job:
            seen.setdefault(m.path.stem, []).append(m.name)
    # a protection backend is named after the scheme it wraps: backends/ckks.py over hazmat/ckks.py is one job
    # in two layers (the backend's policy, the primitive)
    layered = lambda stem, names: sorted(names) == [f"secure_afl.backends.{stem}", f"secure_afl.hazmat.{stem}"]
    dupes = {k: v for k, v in seen.items() if len(v) > 1 and not layered(k, v)}
    assert not dupes, f"file names used by several modules: {dupes}"
