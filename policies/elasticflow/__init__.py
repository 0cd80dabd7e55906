"""ElasticFlow (ASPLOS'23): the policy (`policy`), its planner's model (`model`), the readable
reference planner (`reference`), the fast path (`fast`) through a numba kernel (`kernel`)
compiled ahead of time where built (`aot`), and the one choice between the two (`planner`).
"""

from policies.elasticflow.model import NO_DEADLINE, Allotted, Growing, JobPlan, Need, Steps
from policies.elasticflow.planner import Planner, planner_for
from policies.elasticflow.policy import ElasticFlow

__all__ = ["NO_DEADLINE", "Allotted", "ElasticFlow", "Growing", "JobPlan", "Need", "Planner",
           "Steps", "planner_for"]
