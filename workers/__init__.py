"""The worker agent and its wire protocol (stdlib only; imports nothing from ``broker``).

Two modules make the agent, and a node needs both side by side in one directory:

- ``protocol.py``: the line-delimited JSON protocol as a sans-I/O state machine, imported
  by the agent and by the master (``from workers.protocol import ...``);
- ``agent.py``: the agent itself, run as ``python3 agent.py attach|serve ...``; it imports
  ``protocol`` from its own directory when run as a script.

Shipping the agent means copying every ``*.py`` here except this file (that is what
``broker.shells.ssh.agent_files()`` does); nothing else is needed on the node but python3.
"""
