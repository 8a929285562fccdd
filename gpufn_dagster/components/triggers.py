"""`RefreshSchedule` and `TableSensor`: the example's schedule and sensor, declared in YAML."""

from dataclasses import dataclass
from typing import Annotated

import dagster as dg

from ..assets.triggers import IN_PROCESS_ROWS, refresh_schedule, table_sensor
from ..function_spec.options import described


Targets = Annotated[list[str], described(
    "The Function and view assets to refresh, by asset key ('docs__embedding', 'docs_en').")]


@dataclass(frozen=True, kw_only=True)
class RefreshSchedule(dg.Component, dg.Resolvable):
    """Refresh Functions and views on a cron schedule (see `refresh_schedule`)."""

    name: Annotated[str, described("The schedule's name (its job is '<name>_job').")]
    cron: Annotated[str, described("When, as a cron expression: '0 3 * * *' is 03:00 every day.")]
    targets: Targets
    timezone: Annotated[str, described("The cron expression's time zone.")] = "UTC"
    running: Annotated[bool, described("Whether it starts running (default: stopped until turned on).")] = False

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return dg.Definitions(schedules=[refresh_schedule(self.name, self.cron, self.targets, timezone=self.timezone,
                                                          running=self.running)])


@dataclass(frozen=True, kw_only=True)
class TableSensor(dg.Component, dg.Resolvable):
    """Refresh Functions and views when rows of a table are added, updated or deleted (see `table_sensor`)."""

    table: Annotated[str, described("The LanceDB table to watch.")]
    targets: Targets
    name: Annotated[str | None, described("The sensor's name (default '<table>_changed').")] = None
    minimum_interval_seconds: Annotated[int, described(
        "How often it looks at the table's version (the daemon looks every 5 s at most).")] = 30
    running: Annotated[bool, described("Whether it starts running (default: stopped until turned on).")] = False
    in_process_rows: Annotated[int, described(
        "Appends of at most this many rows refresh with the run's steps in its run worker's own process (no step "
        "process to start); larger changes, updates and deletes run each step in its own process. 0: never.")
    ] = IN_PROCESS_ROWS

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return dg.Definitions(sensors=[table_sensor(self.table, self.targets, name=self.name, running=self.running,
                                                    minimum_interval_seconds=self.minimum_interval_seconds,
                                                    in_process_rows=self.in_process_rows)])
