"""python -m studies list | run NAME [ARGS] | report NAME [ARGS] | machine | publish NAME ... | pages | stale
(each study declared in its folder's study.yaml: studies/__init__.py)."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys

from rla import files
from rla.config import ConfigError
from studies import STUDIES, study
from studies.provenance import machine, publish


def _list(_args) -> int:
    for s in STUDIES.values():
        print(json.dumps({"name": s.name, "target": s.name, "folder": s.folder, "variant_of": s.parent,
                          "outputs": [s.published], "summary": s.summary, "config": s.config, "measure": s.measure,
                          "report": s.report}))
    return 0


def _step(kind: str, name: str, argv: list[str], machine_file: str | None = None) -> int:
    entry = study(name)
    module = getattr(entry, kind)
    if module is None:
        if kind == "measure" and entry.measured_by:
            raise ConfigError(f"study {name!r} has no run step here: it is measured by {entry.measured_by}; "
                              f"snakemake --cores N {entry.name} makes its tables")
        how = "its grid's Snakemake DAG" if kind == "measure" else "its grid's own tables and figures"
        raise ConfigError(f"study {name!r} has no {'run' if kind == 'measure' else 'report'} step of its own: it is "
                          f"{how} (snakemake --cores N {entry.name})")
    if kind == "measure" or machine_file:  # before this process's first compile or description of its machine
        from localrl import remember_isa_checks  # the rig only for the commands that use it: a report runs without it

        remember_isa_checks()
    status = importlib.import_module(module).main(argv)
    if machine_file:  # described by the process that measured, after it ran: the ISA its Inductor used
        files.write_text(machine_file, json.dumps(machine(), indent=1) + "\n")
    return status


def _machine(_args) -> int:
    from localrl import remember_isa_checks  # the rig only for the commands that use it: a report runs without it

    remember_isa_checks()
    print(json.dumps(machine(), indent=1))
    return 0


def _publish(args) -> int:
    entry = study(args.name)
    path = publish(args.source, entry.published, command=args.command, engine=entry.engine, attention=entry.attention,
                   machine_file=args.machine, benchmarks=args.benchmark, include=tuple(args.include),
                   per_machine=entry.per_machine)
    if args.record:
        files.write_text(args.record, path.read_text())
    print(f"published {path.parent} ({path})")
    return 0


def _pages(args) -> int:
    """Render each page (or, with --check, compare it with its render); a page that prints a number no table
    gave, a measured number in prose, or a table that does not state its conditions is not written."""
    from studies import pages  # reads the rig's front door (its staleness): a report runs without the rig

    chosen = [p for p in pages.pages().values() if not args.pages or p.output in args.pages or p.study in args.pages]
    if args.pages and not chosen:
        raise KeyError(f"no page {args.pages}; pages: {', '.join(pages.pages())} (or a study's name)")
    failed = 0
    for page in chosen:
        try:
            pages.render(page)
        except (KeyError, ValueError, TypeError, FileNotFoundError) as err:  # this page's; the others go on
            print(f"{page.template}: {err}", file=sys.stderr)
            failed += 1
            continue
        faults = [f"{page.template}: {what}:\n" + "\n".join(f"  {t}" for t in found)
                  for what, found in (("numbers no table gave", pages.typed_numbers(page)),
                                      ("conditions not stated", pages.table_problems(page))) if found]
        if args.check:
            problems = pages.differences(page) + faults
            failed += bool(problems)
            print("\n".join(problems) if problems else f"{page.output}: as rendered")
        elif faults:
            print("\n".join(faults), file=sys.stderr)
            failed += 1
        else:
            pages.write(page)
            print(f"wrote {page.output} and {page.ledger}")
    return 1 if failed else 0


def _stale(args) -> int:
    from studies import stale  # reads the rig's front door: a report runs without the rig

    found = stale.publications()
    for p in found:
        print(f"{'stale  ' if p.stale else 'current'}  {p.folder}  {p.status}")
        if p.stale and args.verbose:
            print("\n".join(f"           {path}" for path in p.changed))
    print(f"{sum(p.stale for p in found)} of {len(found)} publications stale (their study's code changed after "
          "their provenance commit; rerun: snakemake --cores N NAME)")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="one JSON object per study").set_defaults(func=_list)
    for command, kind in (("run", "measure"), ("report", "report")):
        s = sub.add_parser(command, help=f"a study's {kind} step; its own options follow the name (NAME --help)",
                           add_help=False)
        s.add_argument("name", choices=list(STUDIES), metavar="NAME", help=", ".join(STUDIES))
        s.add_argument("--machine", metavar="FILE", help="also write this machine's JSON (as `machine` prints it) "
                       "here, from the same process")
        s.set_defaults(kind=kind)
    sub.add_parser("machine", help="this machine as JSON (CPU, vector ISA, versions)").set_defaults(func=_machine)
    pub = sub.add_parser("publish", help="copy a study's outputs into studies/NAME/published with provenance.json")
    pub.add_argument("name", choices=list(STUDIES), metavar="NAME")
    pub.add_argument("--source", nargs="+", required=True, help="files or folders to publish")
    pub.add_argument("--include", nargs="*", default=[],
                     help="globs of the files under a folder to publish (default: all)")
    pub.add_argument("--command", required=True, help="the command that made them")
    pub.add_argument("--machine", help="the measuring machine's JSON (python -m studies machine)")
    pub.add_argument("--benchmark", nargs="*", default=[], help="Snakemake benchmark files of its jobs")
    pub.add_argument("--record", help="also write the provenance record here (the Snakemake job's output)")
    pub.set_defaults(func=_publish)
    pg = sub.add_parser("pages", help="render the docs' results pages from the published tables (studies/pages.py)")
    pg.add_argument("--check", action="store_true", help="write nothing; exit 1 where a page differs from its render")
    pg.add_argument("pages", nargs="*", metavar="PAGE", help="only these pages (README.md, docs/results.md, or a "
                    "study's name); default: all")
    pg.set_defaults(func=_pages)
    st = sub.add_parser("stale", help="each publication, current or stale: its study's code changed since its "
                                      "provenance commit (studies/stale.py)")
    st.add_argument("-v", "--verbose", action="store_true", help="name the changed files")
    st.set_defaults(func=_stale)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    args, rest = parser().parse_known_args(argv)
    try:
        if hasattr(args, "kind"):  # run / report: the study's own options follow its name
            return _step(args.kind, args.name, rest, args.machine)
        if rest:
            parser().error(f"unrecognized arguments: {' '.join(rest)}")
        return args.func(args)
    except (ConfigError, FileNotFoundError, KeyError, ValueError) as err:  # bad input: one line naming it
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
