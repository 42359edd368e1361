"""What a run shows its operator: the run report (``report.md``, ``report.json``, ``plot.png``) and the progress view;
and the statistics of paired benchmark comparisons (:mod:`hacrl_fed.report.stats`)."""
