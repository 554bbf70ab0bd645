"""MkDocs hooks (mkdocs.yml `hooks:`): the configuration reference is rendered from the config
dataclasses on every build (roll_lite.config_reference), so the page cannot drift from the code."""

from mkdocs.structure.files import File

PAGE = "configuration.md"


def on_files(files, config):
    from roll_lite.config_reference import render

    stub = files.get_file_from_path(PAGE)
    if stub is not None:  # docs/configuration.md in the repo only says how the page is made
        files.remove(stub)
    files.append(File.generated(config, PAGE, content=render()))
    return files
