"""Debian's Chromium, headless, through chromedriver (Selenium), for the
console's browser tests and `make webui-check`, with nothing beyond loopback:
background networking, component updates, sync, default apps, metrics
reporting and the other start-up fetches Chromium tries are all off."""

from __future__ import annotations

import shutil

FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-extensions", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--metrics-recording-only", "--disable-domain-reliability",
         "--disable-client-side-phishing-detection", "--no-pings",
         "--disable-features=OptimizationHints,MediaRouter,Translate")


def start(width: int, height: int, page_load_timeout: float):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    path, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (path and driver_path):
        raise RuntimeError("Chromium and chromedriver are needed: run `make browser`")
    options = webdriver.ChromeOptions()
    options.binary_location = path
    for flag in (*FLAGS, f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(page_load_timeout)
    return driver
