"""Consumer groups: the classic protocol and KIP-848, with their offsets, in the metadata store.

Pure transition functions (:mod:`.classic`, :mod:`.consumer`, :mod:`.assignors`) decide what a
request or a timer does to a group; :mod:`.store` applies their decisions by compare-and-set;
:mod:`.coordinator` runs the timers of the groups whose lease this broker holds.
"""
