// Upload progress for a console form: <form data-upload-progress> with a <progress data-upload-bar> and an
// element [data-upload-status] inside. The form is sent by XMLHttpRequest so the browser reports how much
// of the file has gone; the answer is then shown as the browser would have shown it: a redirect (the
// post/redirect/get of a successful upload) is followed, an error page replaces the page's <main> and the
// file chosen stays chosen (the form re-rendered by the server keeps every other value). Without
// JavaScript the form posts as usual. No inline script, no eval, requests to this origin only (the CSP).
(function () {
  "use strict";

  function megabytes(bytes) {
    return (bytes / 1e6).toFixed(bytes < 1e7 ? 1 : 0) + " MB";
  }

  function bind(root) {
    var forms = root.querySelectorAll("form[data-upload-progress]");
    Array.prototype.forEach.call(forms, function (form) {
      form.addEventListener("submit", function (event) {
        if (!window.XMLHttpRequest || !window.FormData || !window.DOMParser) {
          return; // an old browser: the plain form post
        }
        event.preventDefault();
        send(form);
      });
    });
  }

  function send(form) {
    var bar = form.querySelector("[data-upload-bar]");
    var status = form.querySelector("[data-upload-status]");
    var button = form.querySelector("button[type=submit]");
    var started = Date.now();
    var xhr = new XMLHttpRequest();
    xhr.open("POST", form.getAttribute("action") || window.location.pathname);
    if (bar) {
      bar.hidden = false;
      bar.removeAttribute("value");
    }
    if (button) {
      button.disabled = true;
    }
    xhr.upload.addEventListener("progress", function (event) {
      if (!event.lengthComputable) {
        return;
      }
      var seconds = (Date.now() - started) / 1000;
      var rate = seconds > 0 ? event.loaded / seconds : 0;
      var left = rate > 0 ? Math.round((event.total - event.loaded) / rate) : null;
      if (bar) {
        bar.max = event.total;
        bar.value = event.loaded;
      }
      if (status) {
        status.textContent =
          "sent " + megabytes(event.loaded) + " of " + megabytes(event.total) +
          " (" + Math.floor((100 * event.loaded) / event.total) + "%)" +
          (left !== null && event.loaded < event.total ? ", about " + left + " s left" : "");
      }
    });
    xhr.upload.addEventListener("load", function () {
      if (bar) {
        bar.removeAttribute("value"); // the server parses and stores the file now: no known end
      }
      if (status) {
        status.textContent = "sent; the server is reading and storing the rows…";
      }
    });
    xhr.addEventListener("load", function () {
      if (xhr.status < 400 && xhr.responseURL) {
        window.location.assign(xhr.responseURL); // the page the upload redirected to
        return;
      }
      show(form, xhr.responseText);
    });
    xhr.addEventListener("error", function () {
      if (button) {
        button.disabled = false;
      }
      if (status) {
        status.textContent = "the upload failed: the connection to the server was lost; try again";
      }
    });
    xhr.send(new FormData(form));
  }

  function show(form, html) {
    var page = new DOMParser().parseFromString(html, "text/html");
    var main = page.querySelector("main");
    var here = document.querySelector("main");
    if (!main || !here) {
      return;
    }
    var chosen = form.querySelector("input[type=file]");
    here.replaceWith(main);
    var again = main.querySelector("form[data-upload-progress] input[type=file]");
    if (chosen && again && chosen.name === again.name) {
      again.replaceWith(chosen); // the browser cannot refill a file input: keep the one chosen
    }
    if (page.title) {
      document.title = page.title;
    }
    bind(main);
    main.scrollIntoView();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () {
      bind(document);
    });
  } else {
    bind(document);
  }
})();
