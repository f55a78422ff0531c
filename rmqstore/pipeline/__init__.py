"""The commit log in byte ranges, read independently and put back together as one walk sees
it: range planning and summaries (:mod:`.ranges`), the rows of the export sources
(:mod:`.rows`), ``dispatch --rebuild --jobs`` (:mod:`.rebuild`) and the local engine of
``export`` and ``stats`` (:mod:`.local`). No pyspark here: :mod:`rmqstore.spark` runs the same
range functions on executors."""
