"""gnndist.samplers: neighbour sampling (static and temporal, local and distributed), a
distributed feature store with caching, and a prefetching loader.

Local kernels are numba (`parallel=True`, `cache=True`) with counter-based random streams:
a given seed gives the same sample for any thread count and any rank layout.
"""
from gnndist.samplers.cache import POLICIES
from gnndist.samplers.distributed import DistNeighborSampler, DistTemporalSampler, sampler_group
from gnndist.samplers.features import DistFeatures, degree_scores, hit_rate, visit_scores
from gnndist.samplers.loader import PrefetchLoader
from gnndist.samplers.static import Blocks, sample_neighbors
from gnndist.samplers.temporal import (TemporalSample, sample_tcsr, sample_temporal_multihop,
                                       sample_temporal_neighbors)

__all__ = ["Blocks", "DistNeighborSampler", "DistTemporalSampler", "DistFeatures", "POLICIES", "PrefetchLoader",
           "TemporalSample", "degree_scores", "hit_rate", "sample_neighbors", "sample_tcsr", "sample_temporal_multihop",
           "sample_temporal_neighbors", "sampler_group", "visit_scores"]
