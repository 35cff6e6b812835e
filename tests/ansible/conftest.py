"""Ansible tests: lint, the shared JoinConfiguration template, role tests on
hostlab hosts.

tests/ansible has no __init__.py on purpose: a package named "ansible" would
shadow ansible-core. The repo root is on sys.path (pyproject's pytest
`pythonpath`); the hostlab fixtures and the `hostlab` marker come from
tests/conftest.py (`tests.hostlab.conftest_plugin`).
"""
