"""A pytest plugin for the test scripts: a skip must never hide a test that has to run.

    PYTHONPATH=scripts python -m pytest -p pytest_must_run --must-run tests/x/test_a.py ...

At the end of the session it prints how many tests passed, failed and skipped, and fails the
session when a test whose node id starts with one of the --must-run prefixes (and none of the
--may-skip ones) was skipped: a missing package or no network must not turn a suite into a silent
pass. Other skips are allowed and listed with their reasons by -rs.
"""
import pytest


def pytest_addoption(parser):
    parser.addoption("--must-run", action="append", default=[], metavar="PREFIX",
                     help="node-id prefix of tests that may not be skipped")
    parser.addoption("--may-skip", action="append", default=[], metavar="PREFIX",
                     help="node-id prefix of tests exempt from --must-run")


class MustRun:
    def __init__(self, prefixes, exempt):
        self.prefixes, self.exempt = tuple(prefixes), tuple(exempt)
        self.counts = {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0}
        self.required_skips = []

    def pytest_runtest_logreport(self, report):
        # One outcome per test: its call, or its setup when that did not pass (a skip or an error).
        if report.when != "call" and not (report.when == "setup" and not report.passed):
            return
        if hasattr(report, "wasxfail"):  # an expected failure ran: not a skip
            self.counts["xfailed"] += 1
            return
        self.counts["passed" if report.passed else "skipped" if report.skipped else "failed"] += 1
        if report.skipped and report.nodeid.startswith(self.prefixes) \
                and not report.nodeid.startswith(self.exempt):
            self.required_skips.append(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter):
        c = self.counts
        terminalreporter.write_line(f"must-run check: {c['passed']} passed, {c['failed']} "
                                    f"failed, {c['skipped']} skipped, {c['xfailed']} xfailed")
        for nodeid in self.required_skips:
            terminalreporter.write_line(f"must-run check: required but skipped: {nodeid}",
                                        red=True)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        if self.required_skips and session.exitstatus == 0:
            session.exitstatus = 1


def pytest_configure(config):
    config.pluginmanager.register(
        MustRun(config.getoption("--must-run"), config.getoption("--may-skip")), "spin-must-run")
