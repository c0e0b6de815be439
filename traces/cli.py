"""`sim trace ...` subcommands: gen, stats (traces.generate / traces.stats), import
(traces.importers), resample (traces.resample) and carry (traces.transform)."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("trace", help="generate, import and describe traces")
    tsub = p.add_subparsers(dest="trace_cmd", required=True, parser_class=type(p))
    from traces import fit, generate, importers, resample, stats, transform

    generate.register(tsub)
    stats.register(tsub)
    importers.register(tsub)
    resample.register(tsub)
    transform.register(tsub)
    fit.register(tsub)
