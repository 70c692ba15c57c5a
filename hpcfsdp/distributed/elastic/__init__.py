"""Training that survives lost ranks, and the torch.distributed.elastic names that scripts use
(``multiprocessing.errors.record``).

In-job recovery over ULFM (see [Note: In-job recovery] in ``_world.py``), one entry point for a training loop::

    from hpcfsdp.distributed import elastic

    ok, why = elastic.ulfm_status()           # an MPI with ULFM, started under `mpirun --with-ft ulfm`?
    copies = elastic.PartnerCopies(interval)  # state copies on a partner host ([Note: Partner copies])
    copies.setup()
    ...                                       # each step: collectives, then
    elastic.commit()                          # uniform: every survivor applies the step, or none
    optimizer.step(); step += 1
    if copies.due(step): copies.save(state_dict(), step)
    ...
    except Exception as e:                    # on every survivor, wherever it was
        if not elastic.is_process_failure(e): raise
        copies.salvage()
        rec = elastic.recover(e, min_ranks=2)  # revoke, shrink, agree; the survivors' default group
        ...                                    # rebuild model, optimizer and meshes on the new world
        step = elastic.restore(new_state_dict, copies.images(), default_group_comm)  # resharded
        copies.setup()

With HYBRID_SHARD the replicas hold every shard: ``PartnerCopies(1, send=False)`` keeps each rank's own image
of every step and no step is lost.

``hpcfsdp train --elastic`` is this loop (hpcfsdp/cli/_elastic.py).
"""

from ._memory import Image, PartnerCopies, StateLost, restore, take_image
from ._world import ProcessFailure, Recovery, commit, is_process_failure, recover, revoke_all, ulfm_status

__all__ = ["ulfm_status", "is_process_failure", "commit", "recover", "revoke_all", "Recovery", "ProcessFailure",
           "Image", "take_image", "restore", "PartnerCopies", "StateLost"]
