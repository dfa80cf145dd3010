"""Command line for identity keys and pinned identity directories (:mod:`.directory`).

``python -m flmarket_flwr.pass_protocol.identity_cli keygen node.pem`` makes a node's key (prints its public
half); ``make`` (``--members``: keyed by member numbers rather than Flower node ids), ``sign`` and ``digest`` build a
directory, sign it as a third party and print the digest that a
node pins; ``check`` reads a directory as a node would, against a digest or a signer key.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from flmarket_flwr.pass_protocol.directory import (
    IdentityDirectory,
    generate_identity,
    load_directory,
    load_identity_key,
    parse_digest,
    parse_public_key,
    public_key_of,
    save_identity_key,
)


def _keygen(args: argparse.Namespace) -> str:
    if Path(args.key).exists():
        raise ValueError(f"{args.key} exists: an identity key is never overwritten")
    return save_identity_key(generate_identity()[0], args.key).hex()


def _public_key(args: argparse.Namespace) -> str:
    return public_key_of(load_identity_key(args.key)).hex()


def _make(args: argparse.Namespace) -> str:
    keys: dict[int, bytes] = {}
    for entry in args.entries:
        node, separator, key = entry.partition("=")
        what = "member" if args.members else "node id"
        if not separator or not (node.isascii() and node.isdigit()):
            raise ValueError(f"{entry!r}: each entry is <{what}>=<64 hex digits of its public key>")
        if int(node) in keys:
            raise ValueError(f"{what} {node} is listed twice")
        keys[int(node)] = parse_public_key(key, f"the key of {what} {node}")
    directory = IdentityDirectory(keys, by_member=args.members)
    Path(args.directory).write_text(directory.to_json() + "\n", encoding="utf-8")
    return directory.digest().hex()


def _sign(args: argparse.Namespace) -> str:
    signer = load_identity_key(args.key)
    directory = IdentityDirectory.from_json(Path(args.directory)).signed_by(signer)
    Path(args.out or args.directory).write_text(directory.to_json() + "\n", encoding="utf-8")
    return public_key_of(signer).hex()


def _digest(args: argparse.Namespace) -> str:
    return IdentityDirectory.from_json(Path(args.directory)).digest().hex()


def _check(args: argparse.Namespace) -> str:
    digest = None if args.digest is None else parse_digest(args.digest, "--digest")
    signer = None if args.signer is None else parse_public_key(args.signer, "--signer")
    directory = load_directory(args.directory, digest=digest, signer=signer)
    return f"{args.directory}: {len(directory)} nodes, pins hold"


def parser() -> argparse.ArgumentParser:
    """The command line's parser (one subcommand per task)."""
    top = argparse.ArgumentParser(prog="python -m flmarket_flwr.pass_protocol.identity_cli", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)
    keygen = commands.add_parser("keygen", help="write a new Ed25519 key (PEM, mode 0600); print its public key")
    keygen.add_argument("key", help="the PEM file to create (never overwritten)")
    keygen.set_defaults(run=_keygen)
    public = commands.add_parser("public-key", help="print the public key (hex) of a PEM private key")
    public.add_argument("key")
    public.set_defaults(run=_public_key)
    make = commands.add_parser("make", help="write a directory of node ids and public keys; print its digest")
    make.add_argument("directory", help="the JSON file to write")
    make.add_argument("entries", nargs="+", metavar="NODE=HEX", help="a node id and its 64-hex-digit public key")
    make.add_argument(
        "--members",
        action="store_true",
        help="the entries are members (e.g. a simulation's partition ids), each bound to its node id of each run "
        "by its own signature (node config identity-member), not Flower node ids",
    )
    make.set_defaults(run=_make)
    sign = commands.add_parser("sign", help="sign a directory with a third party's key; print the signer's key")
    sign.add_argument("directory")
    sign.add_argument("key", help="the signer's PEM private key")
    sign.add_argument("--out", help="where to write the signed directory (default: in place)")
    sign.set_defaults(run=_sign)
    digest = commands.add_parser("digest", help="print a directory's digest (what identity-directory-digest pins)")
    digest.add_argument("directory")
    digest.set_defaults(run=_digest)
    check = commands.add_parser("check", help="read a directory as a node with these pins would")
    check.add_argument("directory")
    check.add_argument("--digest", help="the pinned digest (64 hex digits)")
    check.add_argument("--signer", help="the pinned signer's public key (64 hex digits)")
    check.set_defaults(run=_check)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; print its result, or the error and return 1."""
    args = parser().parse_args(argv)
    try:
        print(args.run(args))
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
