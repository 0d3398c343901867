"""The balancer conformance kit under the name the README first gave it: everything here is
:mod:`shardline.balancer_conformance`'s, which says what each check proves."""

from shardline.balancer_conformance import *  # noqa: F403 (its __all__, below)
from shardline.balancer_conformance import __all__ as __all__
