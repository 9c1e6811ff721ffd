"""Parley: a durable turn engine for chat assistants.

This package holds the I/O-free domain shared by the API, the workflows and the activities
(contracts, settings, ids) plus the operator CLI and the one-command dev supervisor.
"""
