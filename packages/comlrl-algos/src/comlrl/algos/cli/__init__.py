"""The ``comlrl`` command line: ``comlrl train`` / ``eval`` / ``tasks`` / ``recipes``.

It parses, resolves and dispatches: :mod:`~comlrl.algos.cli.main` parses the command line
and hands the recipe that :mod:`comlrl.algos.recipes.registry` names its validated config
(each recipe's own run, ``comlrl.algos.recipes.<family>.run``),
:mod:`~comlrl.algos.cli.resume` finds what ``--resume`` continues, and
:mod:`~comlrl.algos.cli.eval` evaluates saved agents.
"""
