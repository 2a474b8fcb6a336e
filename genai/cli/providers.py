"""``genai providers``: the execution providers, their packages and whether they run here."""

from __future__ import annotations

import argparse
import json

from genai.cli.registry import command
from genai.providers import PluginEPProvider, get_provider_class, list_providers, plugins

__all__: list[str] = []


@command("providers", "list execution providers, their packages, and whether they can run here")
def _fill_providers(prov: argparse.ArgumentParser) -> None:
    prov.description = (
        "List every registered execution provider with the package that provides it and "
        "whether it can run here (or why not). Probes are cheap: nothing is loaded unless "
        "--devices is given."
    )
    prov.add_argument("--json", action="store_true", help="print JSON")
    prov.add_argument(
        "--devices",
        action="store_true",
        help="also load each available plugin EP library and list its devices",
    )
    prov.add_argument("--plugins", action="store_true", help="also list the loaded plugins")
    prov.set_defaults(handler=_providers)


def _providers(args: argparse.Namespace) -> int:
    rows = list_providers()
    registered = {r.name.lower() for r in rows}
    missing = [
        (name, package, runtime)
        for key, (name, package, runtime) in plugins.KNOWN_PROVIDER_PACKAGES.items()
        if key not in registered
    ]
    devices: dict[str, object] = {}
    if args.devices:
        for row in rows:
            cls = get_provider_class(row.name)
            if row.available and issubclass(cls, PluginEPProvider):
                try:
                    devices[row.name] = [d.as_dict() for d in cls().probe_devices()]
                except Exception as exc:
                    devices[row.name] = f"error: {exc}"
    if args.json:
        document = {
            "providers": [
                {**r.as_dict(), **({"devices": devices[r.name]} if r.name in devices else {})}
                for r in rows
            ],
            "not_installed": [
                {
                    "name": key,
                    "package": package,
                    "runtime": runtime,
                    "install": plugins.provider_install_command(key.lower()),
                }
                for key, package, runtime in missing
            ],
        }
        if args.plugins:
            document["plugins"] = [vars(p) for p in plugins.list_plugins()]
        print(json.dumps(document, indent=2, default=list))
        return 0
    width = max(len(name) for name in [*(r.name for r in rows), *(m[0] for m in missing)])
    pwidth = max(len(pkg) for pkg in [*(r.package for r in rows), *(m[1] for m in missing)])
    for r in rows:
        status = "available" if r.available else f"unavailable: {r.reason}"
        print(f"{r.name:<{width}}  {r.package:<{pwidth}}  {status}")
        if r.name in devices:
            found = devices[r.name]
            if isinstance(found, str):
                print(f"{'':<{width}}  devices: {found}")
            else:
                for d in found:  # type: ignore[union-attr]
                    print(f"{'':<{width}}  device: {d['device_type']} {d['vendor']} "
                          f"(id {d['device_id']})")  # fmt: skip
    for key, package, runtime in missing:
        command = plugins.provider_install_command(key.lower())
        print(f"{key:<{width}}  {package:<{pwidth}}  not installed ({command}; "
              f"needs {runtime})")  # fmt: skip
    if args.plugins:
        print()
        for p in plugins.list_plugins():
            origin = "built-in" if p.builtin else f"{p.distribution} {p.version}".strip()
            print(f"plugin {p.name}: {p.module} ({origin}); hooks: {', '.join(p.hooks)}")
    return 0
