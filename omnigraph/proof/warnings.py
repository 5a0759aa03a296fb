"""What ``compile`` warns about in a sound graph: work that will not overlap, budgets a firing may exceed."""

from __future__ import annotations

from ..graph.ir import Graph


def partial_warnings(graph: Graph) -> list[str]:
    out = []
    for n in graph.of_role("generator"):
        p = getattr(n.spec, "partial", None)
        if p is not None and p.budget_tokens and p.budget_tokens * p.max_spans < n.spec.max_new_tokens:
            last = n.spec.max_new_tokens - (p.max_spans - 1) * p.budget_tokens
            out.append(f"{n.name}: partial budget_tokens {p.budget_tokens} x max_spans {p.max_spans} < max_new_tokens "
                       f"{n.spec.max_new_tokens}: a sample in its last firing may still decode {last} tokens, and the "
                       f"firing waits for it; budget_tokens >= {-(-n.spec.max_new_tokens // p.max_spans)} keeps every "
                       "firing within the budget")
    return out


def overlap_warnings(graph: Graph) -> list[str]:
    out = partial_warnings(graph)
    update = graph.trainer
    if any(e.delay > 0 and not e.state for e in graph.edges):
        for gen in graph.of_role("generator"):
            if gen.pool == update.pool and not getattr(gen.spec, "lent", False):   # lent: it fills the idle window
                out.append(f"no overlap: {gen.name} and {update.name} share pool '{gen.pool}' (one actor runs them "
                           "one after another), so the asynchronous schedule buys no time: predicted step = sum; "
                           "put them on different pools to overlap")
    return out
