import sys

from course_lib.grader import main

sys.exit(main())
