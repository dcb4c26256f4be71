"""The dependency graph between operations, and the search for cycles in it.

Nodes are operations (numbered by the caller). An edge T1 -> T2 is

- ww: T1 sent v1 to a key and T2 sent the value right after v1 in that key's version order;
- wr: T1 sent a value that T2 polled.

A cycle of ww edges only is G0 (dirty write); a cycle of ww and wr edges with at least one wr
is G1c (circular information flow), as Adya and Elle name them.

Histories have 10^5 operations, so everything here is iterative (no recursion-depth limit) and
linear in the size of the graph: Tarjan's strongly connected components, then per component
one breadth-first search for each kind of cycle it holds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Literal, NamedTuple

Successors = Callable[[int], Iterable[int]]


class Dependency(NamedTuple):
    """Why an edge exists. ww: the earlier operation sent `value` to `key`, the later one
    sent `next_value`, next in the version order. wr: the later operation polled `value`.
    (A tuple: graphs hold hundreds of thousands of them.)"""

    kind: Literal["ww", "wr"]
    key: str
    value: int
    next_value: int | None = None

    def to_json(self) -> dict[str, Any]:
        step: dict[str, Any] = {"type": self.kind, "key": self.key, "value": self.value}
        if self.next_value is not None:
            step["next_value"] = self.next_value
        return step


@dataclass(frozen=True, slots=True)
class Cycle:
    """One concrete cycle: `nodes` starts and ends with the same node, and `steps[i]` explains
    the edge from `nodes[i]` to `nodes[i + 1]`."""

    anomaly: Literal["G0", "G1c"]
    nodes: tuple[int, ...]
    steps: tuple[Dependency, ...]


class DependencyGraph:
    """ww and wr edges between numbered operations, one explanation kept per edge and kind."""

    def __init__(self) -> None:
        self.ww: dict[int, dict[int, Dependency]] = {}
        self.wr: dict[int, dict[int, Dependency]] = {}

    def add(self, source: int, target: int, dependency: Dependency) -> None:
        if source == target:
            return
        edges = self.ww if dependency.kind == "ww" else self.wr
        targets = edges.get(source)
        if targets is None:
            targets = edges[source] = {}
        if target not in targets:
            targets[target] = dependency

    def count(self, kind: Literal["ww", "wr"]) -> int:
        edges = self.ww if kind == "ww" else self.wr
        return sum(len(targets) for targets in edges.values())

    def successors(self, node: int) -> Iterator[int]:
        yield from self.ww.get(node, ())
        yield from self.wr.get(node, ())

    def sources(self) -> list[int]:
        """Every node with an outgoing edge (only these can be on a cycle)."""
        return sorted(self.ww.keys() | self.wr.keys())

    def dependency(self, source: int, target: int) -> Dependency:
        """The ww explanation of an edge if it has one, else the wr one."""
        found = self.ww.get(source, {}).get(target) or self.wr.get(source, {}).get(target)
        if found is None:
            raise KeyError((source, target))
        return found


def strongly_connected_components(nodes: Iterable[int], successors: Successors) -> list[list[int]]:
    """The components of more than one node, by Tarjan's algorithm with an explicit stack."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    components: list[list[int]] = []
    for root in nodes:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work: list[tuple[int, Iterator[int]]] = [(root, iter(successors(root)))]
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(successors(target))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                # Every successor of `node` is done: close it.
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)
    return components


def find_cycles(graph: DependencyGraph) -> list[Cycle]:
    """One G0 cycle for each group of operations tied by ww edges alone, and one G1c cycle for
    each strongly connected component that holds a wr edge."""
    cycles = []
    for component in strongly_connected_components(graph.sources(), graph.successors):
        members = frozenset(component)
        ww_within = _within(graph.ww, members)
        for group in strongly_connected_components(component, ww_within):
            start = group[0]
            grouped = frozenset(group)
            after = next(t for t in graph.ww[start] if t in grouped)
            path = _shortest_path(after, start, _within(graph.ww, grouped))
            nodes = (start, *path)
            steps = tuple(graph.ww[a][b] for a, b in pairwise(nodes))
            cycles.append(Cycle("G0", nodes, steps))
        read = _edge_within(graph.wr, component, members)
        if read is not None:
            writer, reader = read
            path = _shortest_path(reader, writer, _within_any(graph, members))
            nodes = (writer, *path)
            rest = (graph.dependency(a, b) for a, b in pairwise(nodes[1:]))
            steps = (graph.wr[writer][reader], *rest)
            cycles.append(Cycle("G1c", nodes, steps))
    return cycles


def _within(edges: dict[int, dict[int, Dependency]], members: frozenset[int]) -> Successors:
    def successors(node: int) -> Iterator[int]:
        return (target for target in edges.get(node, ()) if target in members)

    return successors


def _within_any(graph: DependencyGraph, members: frozenset[int]) -> Successors:
    def successors(node: int) -> Iterator[int]:
        return (target for target in graph.successors(node) if target in members)

    return successors


def _edge_within(
    edges: dict[int, dict[int, Dependency]], component: list[int], members: frozenset[int]
) -> tuple[int, int] | None:
    for source in component:
        for target in edges.get(source, ()):
            if target in members:
                return source, target
    return None


def _shortest_path(start: int, goal: int, successors: Successors) -> list[int]:
    """The nodes of a shortest path from `start` to `goal`, both included (breadth-first).
    The caller knows one exists: both are in one strongly connected component."""
    parent: dict[int, int] = {start: start}
    queue = deque([start])
    while queue and goal not in parent:
        node = queue.popleft()
        for target in successors(node):
            if target not in parent:
                parent[target] = node
                queue.append(target)
    path = [goal]
    while path[-1] != start:
        path.append(parent[path[-1]])
    path.reverse()
    return path
