"""The steering console: a static page under /ui that drives the management
API (/api) and the OpenAI routes from the browser.

Plain HTML, CSS and JavaScript in rest_bridge/ui, served as they are: no build
step, no third-party script, nothing fetched from elsewhere, so it works
offline. The page holds no secret: the operator types the admin key into it,
and the page keeps it in memory and sends it with each API call. The files
are served without a key (access.py), since they carry none.
"""

from __future__ import annotations

import pathlib

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse

from rest_bridge.errors import OpenAIError

router = APIRouter()

UI_DIR = pathlib.Path(__file__).resolve().parent.parent / "ui"
FILES = {
    "index.html": "text/html; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "panels.js": "text/javascript; charset=utf-8",
    "playground.js": "text/javascript; charset=utf-8",
    "workbench.js": "text/javascript; charset=utf-8",
}
# The page is small and changes with the bridge: always revalidated.
HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


@router.get("/ui", include_in_schema=False)
async def console_root():
    return RedirectResponse("/ui/", status_code=308)


@router.get("/ui/{name}", include_in_schema=False)
async def console_file(name: str):
    name = name or "index.html"
    media = FILES.get(name)
    if media is None:
        raise OpenAIError(404, f"The console has no file '/ui/{name}'.", code="not_found")
    return FileResponse(UI_DIR / name, media_type=media, headers=HEADERS)


@router.get("/ui/", include_in_schema=False)
async def console_index():
    return await console_file("index.html")
