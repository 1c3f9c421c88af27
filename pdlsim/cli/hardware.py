"""``pdlsim hardware``: the packaged GPU, node and network presets, and one of them as a file
to copy and edit (``--gpu-preset FILE``, ``--node FILE``, ``--network FILE``)."""

from __future__ import annotations

import argparse
import json

__all__ = ["add_hardware_parser"]


def add_hardware_parser(commands: argparse._SubParsersAction, parser_class: type) -> None:
    p = commands.add_parser("hardware", help="GPU, node and network presets (data sheets)")
    actions = p.add_subparsers(dest="hardware_command", metavar="ACTION",
                               parser_class=parser_class)  # fmt: skip
    actions.required = True
    listing = actions.add_parser("list", help="every preset by kind, with its source")
    listing.add_argument("--hardware", default=None, metavar="FILE",
                         help="a JSON file shaped as pdlsim/costmodel/hardware.json over the "
                         "packaged presets")  # fmt: skip
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    listing.set_defaults(handler=_cmd_list)
    show = actions.add_parser(
        "show", help="one preset as a file of one entry: save it, edit it, pass it back"
    )
    show.add_argument("name", metavar="NAME", help="a GPU, node or network preset")
    show.add_argument("--hardware", default=None, metavar="FILE", help="as for list")
    show.set_defaults(handler=_cmd_show)


def _cmd_list(args: argparse.Namespace) -> int:
    from pdlsim.costmodel.presets import load_hardware

    hw = load_hardware(args.hardware)
    sections = {"gpus": hw.gpus, "nodes": hw.nodes, "networks": hw.networks}
    if args.json:
        doc = {kind: {n: p.source for n, p in sect.items()} for kind, sect in sections.items()}
        print(json.dumps(doc, indent=1))
        return 0
    lines = []
    for kind, section in sections.items():
        lines.append(f"{kind}:")
        lines += [f"  {name:<14} {preset.source}" for name, preset in section.items()]
    print("\n".join(lines))
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from pdlsim.costmodel.presets import load_hardware

    _, fields = load_hardware(args.hardware).entry(args.name)
    print(json.dumps(fields, indent=1))
    return 0
