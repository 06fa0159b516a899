"""The ``comlrl`` command line: ``comlrl train`` / ``eval`` / ``tasks`` / ``recipes``.

:mod:`~comlrl.algos.cli.main` parses the command line, :mod:`~comlrl.algos.cli.registry` names
the recipes, :mod:`~comlrl.algos.cli.runs` runs one end to end, :mod:`~comlrl.algos.cli.eval`
evaluates saved agents, :mod:`~comlrl.algos.cli.preflight` checks a run before any model loads.
"""
