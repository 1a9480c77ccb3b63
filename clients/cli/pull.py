"""`lineage pull REF`: download a model into the Hugging Face cache, and serve nothing.

REF is `org/name` or `org/name@revision`. It asks the Hub even when the cache
holds the revision (a branch may have moved); what is already there is not
fetched again. Failures are engine.hub's one line and exit status.
"""

from __future__ import annotations

import argparse

from clients.cli.args import EXIT_OK, CommandError, UsageError

HELP = "download a model (org/name[@revision]) into the Hugging Face cache"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ref", metavar="REF", help="a Hugging Face repository: org/name[@revision]")


def run(args: argparse.Namespace) -> int:
    from engine import hub

    if hub.parse_ref(args.ref) is None:
        raise UsageError(f"{args.ref!r} is no repository id (org/name[@revision])")
    try:
        path = hub.resolve(args.ref, hub.HubSettings.from_env(args.env), label="", refresh=True)
    except hub.HubError as error:
        raise CommandError(str(error), error.status)
    print(f"lineage: {args.ref} is in {path}")
    return EXIT_OK
