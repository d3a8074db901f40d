"""The subcommands of ``fsobs``: for each, the module whose ``add_*`` function builds its
parser, and its line in ``fsobs --help``.

Light on purpose (no other import): ``fsobs --help`` lists the commands from here, and
``fsobs COMMAND ...`` imports only COMMAND's module (:func:`fsobs.cli.build_parser`), so that
argument parsing imports no pandas, torch or streamlit and a command starts working at once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    module: str
    """The module under ``fsobs.cli`` that builds the parser and runs the command."""
    add: str
    """The function of :attr:`module` that adds the command's parser to the subcommands."""
    help: str
    """The command's line in ``fsobs --help``."""


COMMANDS = {
    "analyze": Command("analysis", "add_analyze", "analyze a run directory or Kineto trace files"),
    "export": Command(
        "analysis",
        "add_export",
        "write the run's traces with bubble tracks added (for Perfetto / chrome://tracing)",
    ),
    "compare": Command(
        "analysis",
        "add_compare",
        "A/B: the bubble reduction of a test run against a control run, or of several pairs",
    ),
    "fit-cost": Command(
        "analysis",
        "add_fit_cost",
        "fit the balancer's per-sample cost model c(L) = c0 + a*L + b*L^2 on a run "
        "(or a padded model's batch cost: --shape padded)",
    ),
    "dashboard": Command(
        "dashboard", "add_dashboard", "open the Streamlit dashboard on a run store"
    ),
    "run": Command(
        "run",
        "add_run",
        "train the reference job on N ranks with torchrun, writing a run directory",
    ),
    "whatif": Command(
        "whatif",
        "add_whatif",
        "predict each optimizer toggle, alone and combined, from one baseline run",
    ),
    "simulate": Command(
        "whatif",
        "add_simulate",
        "simulate the job on N ranks and write it in the run format (with truth.json)",
    ),
    "watch": Command(
        "live",
        "add_watch",
        "follow a run while its job writes it: steps per rank, windows, alerts",
    ),
    "capture": Command("live", "add_capture", "ask a running job to profile its next steps"),
}
"""In the order of ``fsobs --help``."""
