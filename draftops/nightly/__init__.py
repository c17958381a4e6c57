"""Nightly regression runs: playbooks, parallel hosts, detection across nights, report, schedule."""
