"""Agents for the system-check tests: two distinct agents that share one name, and a module
attribute that is not an agent. Their names are used by no other test."""

import durable_agents as da
from durable_agents.providers import ScriptedModel, scripted

twin_a = da.Agent("check-twin", ScriptedModel([scripted.text("a")]), "A.")
twin_b = da.Agent("check-twin", ScriptedModel([scripted.text("b")]), "B.")
not_an_agent = "just a string"
