"""Reading the desired state while watching: a file or a directory, through link swaps.

Layouts are the ones watch meets in production, built for real on disk: a ConfigMap volume
(``name.yaml → ..data/name.yaml``, ``..data → ..<timestamp>``), a git-sync root (``current →
.worktrees/<sha>``), and a file an editor replaces by rename.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler.catalog import Catalog, default_catalog
from reconciler.desired import directory_files, load_desired
from reconciler.model import Problem, ValidationError
from reconciler.watch.source import DesiredSource

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "desired-state" / "harvester-kgd9c.yaml"
NODE = "harvester-kgd9c"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return default_catalog()


def configmap_volume(
    root: Path, files: dict[str, str], stamp: str = "..2025_01_01_00_00_00.1"
) -> Path:
    """The layout the kubelet gives a ConfigMap volume, as its atomic writer builds it."""
    root.mkdir(exist_ok=True)
    data = root / stamp
    data.mkdir()
    for name, text in files.items():
        (data / name).write_text(text)
    tmp = root / "..data_tmp"
    tmp.symlink_to(stamp)
    os.replace(tmp, root / "..data")
    for name in files:
        link = root / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    return root


def seed_text(profile: str = "NVIDIA A2-4A") -> str:
    return SEED.read_text().replace('"0000:08:00.4": NVIDIA A2-4A', f'"0000:08:00.4": {profile}')


# -- directory loading (reconciler.desired) ---------------------------------------------------


def test_a_directory_stands_for_its_yaml_files_sorted(tmp_path: Path) -> None:
    for name in ("b.yml", "a.yaml", "notes.txt", ".hidden.yaml", "c.yaml.swp"):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub.yaml").mkdir()  # a directory named like a file is not one
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "deep.yaml").write_text("x")
    assert directory_files(tmp_path) == [tmp_path / "a.yaml", tmp_path / "b.yml"]


def test_a_configmap_volume_is_read_once_per_key(tmp_path: Path, catalog: Catalog) -> None:
    volume = configmap_volume(tmp_path / "cm", {"harvester-kgd9c.yaml": seed_text()})
    desired = load_desired([volume], catalog=catalog, directories=True)
    # Not also ..data/harvester-kgd9c.yaml: that would define every GPU twice.
    assert desired.files == (str(volume / "harvester-kgd9c.yaml"),)
    assert NODE in desired.nodes


def test_problems_in_a_directory_name_the_file_line_and_column(
    tmp_path: Path, catalog: Catalog
) -> None:
    (tmp_path / "a.yaml").write_text(seed_text())
    (tmp_path / "b.yaml").write_text(seed_text().replace("sriov: enabled", "sriov: on"))
    with pytest.raises(ValidationError) as info:
        load_desired([tmp_path], catalog=catalog, directories=True)
    files = {p.file for p in info.value.problems}
    assert str(tmp_path / "b.yaml") in files
    assert all(p.line for p in info.value.problems)


def test_an_empty_directory_is_a_problem(tmp_path: Path, catalog: Catalog) -> None:
    with pytest.raises(ValidationError) as info:
        load_desired([tmp_path], catalog=catalog, directories=True)
    assert info.value.problems == (
        Problem("no desired-state files (*.yaml, *.yml) here", file=str(tmp_path)),
    )


def test_without_directories_a_directory_is_still_refused(tmp_path: Path, catalog: Catalog) -> None:
    (tmp_path / "a.yaml").write_text(seed_text())
    with pytest.raises(ValidationError) as info:
        load_desired([tmp_path], catalog=catalog)
    assert info.value.problems == (
        Problem("is a directory, not a desired-state file", file=str(tmp_path)),
    )


# -- DesiredSource -----------------------------------------------------------------------------


def test_loads_this_nodes_entry(tmp_path: Path, catalog: Catalog) -> None:
    (tmp_path / "seed.yaml").write_text(seed_text())
    node = DesiredSource.at(tmp_path / "seed.yaml").load(catalog=catalog, node=NODE)
    assert node is not None
    assert node.name == NODE
    assert DesiredSource.at(tmp_path).load(catalog=catalog, node="elsewhere") is None


def test_the_fingerprint_follows_content_not_reads(tmp_path: Path) -> None:
    path = tmp_path / "seed.yaml"
    path.write_text(seed_text())
    source = DesiredSource.at(path)
    first = source.fingerprint()
    assert source.fingerprint() == first
    path.write_text(seed_text("NVIDIA A2-4C"))
    assert source.fingerprint() != first
    path.write_text(seed_text())
    assert source.fingerprint() == first


def test_an_editors_rename_over_the_file_changes_the_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "seed.yaml"
    path.write_text(seed_text())
    source = DesiredSource.at(path)
    first = source.fingerprint()
    tmp = tmp_path / ".seed.yaml.swp"
    tmp.write_text(seed_text("NVIDIA A2-4C"))
    assert source.fingerprint() == first  # the temporary file is not read
    os.replace(tmp, path)
    assert source.fingerprint() != first


def test_a_configmap_update_changes_the_fingerprint(tmp_path: Path) -> None:
    volume = configmap_volume(tmp_path / "cm", {"seed.yaml": seed_text()})
    source = DesiredSource.at(volume)
    first = source.fingerprint()
    configmap_volume(volume, {"seed.yaml": seed_text("NVIDIA A2-4C")}, stamp="..2025_01_02")
    assert source.fingerprint() != first


def test_a_missing_or_unreadable_path_has_a_fingerprint_too(tmp_path: Path) -> None:
    source = DesiredSource.at(tmp_path / "nope.yaml")
    assert source.fingerprint() == source.fingerprint()
    (tmp_path / "nope.yaml").write_text("")
    assert source.fingerprint() != DesiredSource.at(tmp_path / "other.yaml").fingerprint()


def test_watch_points_of_a_file_and_of_a_directory(tmp_path: Path) -> None:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "seed.yaml").write_text(seed_text())
    real = os.path.realpath(tmp_path)
    assert DesiredSource.at(tmp_path / "ds" / "seed.yaml").watch_points() == {f"{real}/ds"}
    assert DesiredSource.at(tmp_path / "ds").watch_points() == {real, f"{real}/ds"}


def test_watch_points_of_a_git_sync_checkout_include_the_link_swapped(tmp_path: Path) -> None:
    root = tmp_path / "git"
    (root / ".worktrees" / "abc" / "desired-state").mkdir(parents=True)
    (root / "current").symlink_to(".worktrees/abc")
    source = DesiredSource.at(root / "current" / "desired-state")
    real = os.path.realpath(root)
    assert source.watch_points() == {
        real,  # where git-sync swaps `current`
        f"{real}/.worktrees/abc",  # the path's parent, as it resolves now
        f"{real}/.worktrees/abc/desired-state",  # the files' directory
    }
    (root / ".worktrees" / "def" / "desired-state").mkdir(parents=True)
    (root / "tmp-link").symlink_to(".worktrees/def")
    os.replace(root / "tmp-link", root / "current")
    assert f"{real}/.worktrees/def/desired-state" in source.watch_points()


def test_a_path_that_does_not_exist_yet_is_watched_from_its_nearest_ancestor(
    tmp_path: Path,
) -> None:
    source = DesiredSource.at(tmp_path / "not" / "yet" / "seed.yaml")
    assert source.watch_points() == {os.path.realpath(tmp_path)}


# -- links in a directory: followed only to files inside it ---------------------------------------

#: What a file outside the directory holds: no problem may quote it.
OUTSIDE = "root:$6$saltsalt$Q1w2E3r4T5y6U7i8O9p0:19000:0:99999:7:::\n"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "etc" / "shadow"
    path.parent.mkdir()
    path.write_text(OUTSIDE)
    return path


@pytest.mark.parametrize(
    "target",
    ["ABSOLUTE", "../etc/shadow", "..data/../../etc/shadow", "sub/../../etc/shadow"],
)
def test_a_link_leading_outside_is_listed_and_refused_naming_it(
    tmp_path: Path, catalog: Catalog, outside: Path, target: str
) -> None:
    directory = tmp_path / "ds"
    (directory / "sub").mkdir(parents=True)
    (directory / "..data").mkdir()
    link_target = str(outside) if target == "ABSOLUTE" else target
    (directory / "evil.yaml").symlink_to(link_target)
    (directory / "good.yaml").write_text(seed_text())
    assert directory_files(directory) == [directory / "evil.yaml", directory / "good.yaml"]
    with pytest.raises(ValidationError) as info:
        load_desired([directory], catalog=catalog, directories=True)
    (problem,) = info.value.problems
    assert problem.file == str(directory / "evil.yaml")
    assert problem.message.startswith("evil.yaml is a link to ")
    assert f", outside {directory}: not read" in problem.message
    assert "saltsalt" not in problem.message


def test_a_link_inside_leading_out_through_a_second_link_is_refused(
    tmp_path: Path, catalog: Catalog, outside: Path
) -> None:
    """A ConfigMap-looking layout whose ``..data`` leads out of the directory."""
    directory = tmp_path / "ds"
    directory.mkdir()
    (directory / "..data").symlink_to(outside.parent)
    (directory / "shadow.yaml").symlink_to("..data/shadow")
    with pytest.raises(ValidationError) as info:
        load_desired([directory], catalog=catalog, directories=True)
    (problem,) = info.value.problems
    assert problem.message.startswith(f"..data is a link to {outside.parent}, outside")


def test_links_inside_the_directory_are_followed(tmp_path: Path, catalog: Catalog) -> None:
    directory = tmp_path / "ds"
    (directory / ".shared").mkdir(parents=True)
    (directory / ".shared" / "node.yml").write_text(seed_text())
    (directory / "node.yaml").symlink_to(".shared/node.yml")
    (directory / "absolute.yaml").symlink_to(directory / ".shared" / "node.yml")
    (directory / "dangling.yaml").symlink_to("nowhere.yaml")
    (directory / "dir.yaml").symlink_to(".shared")
    os.mkfifo(directory / "fifo.yaml")
    (directory / "loop.yaml").symlink_to("loop.yaml")
    assert directory_files(directory) == [directory / "absolute.yaml", directory / "node.yaml"]
    (directory / "absolute.yaml").unlink()
    desired = load_desired([directory], catalog=catalog, directories=True)
    assert NODE in desired.nodes


def test_the_fingerprint_reads_only_inside_the_directory(tmp_path: Path, outside: Path) -> None:
    directory = tmp_path / "ds"
    directory.mkdir()
    (directory / "evil.yaml").symlink_to(outside)
    source = DesiredSource.at(directory)
    first = source.fingerprint()
    outside.write_text("changed\n")  # not read: the fingerprint cannot follow it
    assert source.fingerprint() == first


def test_a_named_file_is_read_through_its_link_wherever_it_leads(
    tmp_path: Path, catalog: Catalog
) -> None:
    """The operator names a file: that choice is followed as given (only a directory's entries
    are confined to it)."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "seed.yaml").write_text(seed_text())
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "seed.yaml").symlink_to(tmp_path / "elsewhere" / "seed.yaml")
    assert NODE in load_desired([tmp_path / "ds" / "seed.yaml"], catalog=catalog).nodes


def test_a_directory_of_too_many_entries_is_refused_without_listing_it_all(
    tmp_path: Path, catalog: Catalog
) -> None:
    """A directory is listed at most 4,096 entries deep (a desired state has 1,000 files at most):
    one of millions would otherwise be held whole in the agent's memory before any check."""
    directory = tmp_path / "ds"
    directory.mkdir()
    (directory / "seed.yaml").write_text(seed_text())
    for i in range(4096):
        (directory / f"junk-{i}").touch()
    with pytest.raises(ValidationError) as info:
        load_desired([directory], catalog=catalog, directories=True)
    assert info.value.problems == (
        Problem(
            "cannot list: more than 4,096 entries: not a desired-state directory (it holds "
            "1,000 files at most)",
            file=str(directory),
        ),
    )
    (directory / "junk-0").unlink()  # 4,096 entries: listed, and the one file in it read
    assert NODE in load_desired([directory], catalog=catalog, directories=True).nodes


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path, catalog: Catalog) -> None:
    """Opening a FIFO for reading waits for a writer that never comes: the agent would hang.
    Named as the file or as a directory's entry, it is not a regular file and is refused."""
    fifo = tmp_path / "node.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ValidationError) as info:
        load_desired([fifo], catalog=catalog)
    assert info.value.problems == (Problem("cannot read: not a regular file", file=str(fifo)),)
    assert DesiredSource.at(fifo).fingerprint() != DesiredSource.at(tmp_path / "none").fingerprint()
    with pytest.raises(ValidationError) as info:
        load_desired([tmp_path], catalog=catalog, directories=True)
    assert info.value.problems == (
        Problem("no desired-state files (*.yaml, *.yml) here", file=str(tmp_path)),
    )
