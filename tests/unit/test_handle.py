import gc

from vkgraph.runtime.handle import VkObject, collected_objects, live_objects


class Fake(VkObject):
    def __init__(self, log, name, parent=None):
        self.name = name
        self._own(parent, lambda: log.append(name))


class FakeParent(Fake):
    pass


def test_destroy_is_idempotent_and_counted():
    log = []
    before = live_objects().get("Fake", 0)
    obj = Fake(log, "a")
    assert obj.alive and live_objects()["Fake"] == before + 1
    obj.destroy()
    obj.destroy()
    assert log == ["a"] and not obj.alive
    assert live_objects().get("Fake", 0) == before


def test_context_manager():
    log = []
    with Fake(log, "a") as obj:
        assert obj.alive
    assert log == ["a"]


def test_parent_destroys_live_children_newest_first():
    log = []
    parent = FakeParent(log, "parent")
    kids = [Fake(log, f"k{i}", parent) for i in range(4)]
    kids[1].destroy()
    grandchild = Fake(log, "g", kids[2])
    parent.destroy()
    assert log == ["k1", "k3", "g", "k2", "k0", "parent"]
    assert not any(k.alive for k in kids) and not grandchild.alive


def test_child_release_skipped_once_parent_is_gone():
    log = []
    parent = FakeParent(log, "parent")
    child = Fake(log, "child", parent)
    # Simulate the parent's backstop running first (e.g. out-of-order collection of a cycle).
    _obj, release, args, _kw = parent._finalizer.detach()
    child.destroy()
    assert log == []
    assert not child.alive
    release(*args, explicit=True)
    assert log == ["parent"]


def test_garbage_collected_objects_are_released_and_reported():
    log = []
    before = collected_objects().get("Fake", 0)
    Fake(log, "dropped")
    gc.collect()
    assert log == ["dropped"]
    assert collected_objects()["Fake"] == before + 1


def test_backstop_does_not_keep_the_object_alive():
    import weakref

    log = []
    obj = Fake(log, "x")
    ref = weakref.ref(obj)
    del obj
    gc.collect()
    assert ref() is None and log == ["x"]
